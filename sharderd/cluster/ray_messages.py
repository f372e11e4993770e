"""Ray's cluster messages as daemon log lines, not raw text in the JSON log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.logs import get_logger

__all__ = ["route_ray_messages"]

_log = get_logger(__name__)


def route_ray_messages() -> None:
    """Ray prints cluster messages ("node ... marked dead") to the driver's stdout, which is the
    daemon's JSON log: send them through the log as ``cluster.message`` lines instead."""
    import ray._private.worker as ray_worker

    def log_lines(data: Mapping[str, Any], ignore_prefix: bool = False) -> None:
        for line in data.get("lines", ()):
            _log.warning(
                "cluster.message", source=str(data.get("pid", "")), message=str(line)[:2000]
            )

    ray_worker.print_to_stdstream = log_lines
