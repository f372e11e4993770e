"""What came back from an attempt's Ray task: a lost try, a failed task, or an outcome to accept.

A lost node or worker is an error (the job runs again as a new try); anything else becomes the
attempt's outcome, and a sealed artifact is used only when its size and sha256 match.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.cluster import artifacts
from sharderd.cluster.errors import AttemptLostError
from sharderd.logs import get_logger

__all__ = ["accept_result", "read_result"]

_LOST: Final = (
    "NodeDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "ObjectFetchTimedOutError",
    "RaySystemError",
)
"""Ray errors that mean the try was lost, not that the attempt failed."""

_log = get_logger(__name__)


def read_result(ray: Any, ref: Any) -> dict[str, Any]:
    """A finished task's value; a lost node or worker raises, any other failure is ``crashed``."""
    try:
        value: dict[str, Any] = ray.get(ref, timeout=0)
    except Exception as exc:
        name = type(exc).__name__
        if name in _LOST or isinstance(exc, getattr(ray.exceptions, "NodeDiedError", ())):
            raise AttemptLostError(
                f"the Ray node or worker running the attempt died ({name}): {str(exc).splitlines()[0][:300]}",
                hint="sharderd runs the job again on the nodes left; check the node's raylet log.",
            ) from None
        cause = getattr(exc, "cause", None) or exc
        return {
            "outcome": AttemptOutcome(
                "crashed",
                f"the attempt's Ray task failed: {type(cause).__name__}: "
                f"{str(cause).splitlines()[0][:500] if str(cause) else ''}",
            ).to_json()
        }
    return value


def accept_result(
    result: Mapping[str, Any], request: AttemptRequest, workdir: Path, attempt: str
) -> AttemptOutcome:
    """The task's outcome, with its artifact checked and moved into the local attempt folder."""
    outcome = AttemptOutcome.from_json(result["outcome"])
    where = result.get("where") or {}
    sealed = result.get("artifact")
    _log.info(
        "attempt.ran",
        attempt=attempt,
        node_id=where.get("node_id"),
        host=where.get("host"),
        worker_pid=where.get("pid"),
        result=outcome.outcome,
        artifact_bytes=sealed["size"] if sealed else None,
        sha256=sealed["sha256"] if sealed else None,
    )
    outcome = dataclasses.replace(
        outcome, details={**(outcome.details or {}), "cluster": dict(where)}
    )
    if sealed is None:
        return dataclasses.replace(outcome, artifact=request.artifact if outcome.artifact else None)
    shared = Path(sealed["path"])
    try:
        got = artifacts.digest(shared)
    except (OSError, ValueError) as exc:
        problem = f"unreadable: {exc}"
    else:
        problem = (
            ""
            if (got.size, got.sha256) == (sealed["size"], sealed["sha256"])
            else (
                f"{got.size} bytes, sha256 {got.sha256[:16]}… where the node sealed "
                f"{sealed['size']} bytes, sha256 {str(sealed['sha256'])[:16]}…"
            )
        )
    if problem:
        _log.error(
            "attempt.artifact_mismatch", attempt=attempt, artifact=str(shared), problem=problem
        )
        return dataclasses.replace(
            outcome,
            outcome="crashed",
            artifact=None,
            message=f"the compiled artifact in shared_dir does not match what the node "
            f"wrote ({problem}); not used",
        )
    local = Path(request.artifact)
    if local.exists():
        shutil.rmtree(local) if local.is_dir() else local.unlink()
    shutil.move(str(shared), local)
    return dataclasses.replace(outcome, artifact=str(local))
