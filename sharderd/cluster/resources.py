"""What one attempt reserves on a Ray cluster, and why no node could ever hold it.

Ray leaves an impossible request pending for ever; this check turns it into a job failure that
names the missing resource.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sharderd.backends.protocol import AttemptRequest
from sharderd.config import ClusterConfig
from sharderd.units import fmt_bytes

__all__ = ["required_resources", "unschedulable_reason"]


def required_resources(cluster: ClusterConfig, request: AttemptRequest) -> dict[str, float]:
    """What one attempt reserves: CPUs, a memory floor, the SDK marker, and for a poprt
    benchmark as many IPUs as its plan has devices (it attaches to all of them)."""
    need: dict[str, float] = {"CPU": cluster.num_cpus}
    if cluster.memory_bytes:
        need["memory"] = float(cluster.memory_bytes)
    if cluster.sdk_resource:
        need[cluster.sdk_resource] = 1.0
    if cluster.ipu_resource and request.benchmark and request.backend == "poprt":
        need[cluster.ipu_resource] = float(request.num_devices)
    return {k: v for k, v in need.items() if v > 0}


def unschedulable_reason(
    need: Mapping[str, float], nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no alive node can hold ``need`` (naming every resource no node has enough of), or None."""
    alive = [n for n in nodes if n.get("Alive")]
    totals = [dict(n.get("Resources") or {}) for n in alive]
    if any(all(t.get(k, 0.0) >= v for k, v in need.items()) for t in totals):
        return None
    if not alive:
        return "the Ray cluster has no alive node"
    short = []
    for key, value in need.items():
        most = max((t.get(key, 0.0) for t in totals), default=0.0)
        if most < value:
            short.append(
                f"{_amount(key, value)} of resource {key!r} "
                f"(the most any of its {len(alive)} node(s) has: {_amount(key, most)})"
            )
    if short:
        return f"no node of the Ray cluster has {', nor '.join(short)}"
    return f"no single node of the Ray cluster has all of {dict(need)} at once"


def _amount(key: str, value: float) -> str:
    return fmt_bytes(int(value)) if key in ("memory", "object_store_memory") else f"{value:g}"
