"""Staging one attempt for a Ray task: its folder copied into ``shared_dir``, paths pointed there.

The node sees only ``shared_dir``, so every path in the request that names the local attempt folder
is rewritten, and the artifact is written under a temporary name until the task seals it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sharderd.backends.protocol import AttemptRequest
from sharderd.cluster import artifacts
from sharderd.config import ClusterConfig

__all__ = ["stage_attempt"]


def stage_attempt(
    cluster: ClusterConfig,
    request: AttemptRequest,
    workdir: Path,
    remote_dir: Path,
    job_id: str,
    timeout: float,
    kill_grace: float,
    argv_prefix: Sequence[str] | None,
) -> dict[str, Any]:
    """Copy the attempt folder into ``shared_dir`` and point the request's paths there."""
    shutil.copytree(workdir, remote_dir, dirs_exist_ok=False)
    local, remote = str(workdir), str(remote_dir)

    def moved(value: Any) -> Any:
        if isinstance(value, str) and (value == local or value.startswith(local + "/")):
            return remote + value[len(local) :]
        return value

    final = Path(moved(request.artifact))
    written = final.with_name(artifacts.TMP_PREFIX + final.name)
    staged = dataclasses.replace(
        request,
        model=moved(request.model),
        artifact=str(written),
        options={k: moved(v) for k, v in request.options.items()},
    )
    env = {
        name: value
        for name in cluster.env_passthrough
        if (value := os.environ.get(name)) is not None
    }
    return {
        "request": dataclasses.asdict(staged),
        "workdir": remote,
        "artifact_final": str(final),
        "job_id": job_id,
        "timeout": timeout,
        "kill_grace": kill_grace,
        "env": env,
        "sweep_dir": str(cluster.sweep_dir),
        "argv_prefix": list(argv_prefix) if argv_prefix else None,
    }
