"""What a report's measurements are: where they were taken, and whether they compare with the plan's.

The plan predicts times on the *target* (``ipu-mk2`` by default); a backend measures them on
whatever ran the stages. PopRT on IPUs measures the target itself; onnxruntime measures its
execution providers on this host, usually a CPU. Absolute times compare only on the same kind of
device; across devices only the shape of the profile does: each stage's share of the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Measurement", "amp_of", "measurement", "shares"]

_PROVIDER_KINDS: Final = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "gpu",
    "TensorrtExecutionProvider": "gpu",
    "ROCMExecutionProvider": "gpu",
    "MIGraphXExecutionProvider": "gpu",
    "DmlExecutionProvider": "gpu",
}


@dataclass(frozen=True, slots=True)
class Measurement:
    where: str
    """``onnxruntime (CPUExecutionProvider) on the host that ran sharderd``, ``PopRT on the IPUs``."""
    same_device: bool
    """The measuring device is the kind the plan predicted for: absolute times compare."""


def measurement(report: Mapping[str, Any], attempt: Mapping[str, Any] | None = None) -> Measurement:
    """Where ``attempt`` (else the chosen one) measured, judged against the report's target."""
    target = report.get("target") or {}
    kind, name = target.get("kind"), target.get("name", "?")
    backend = str(report.get("backend"))
    if attempt is None:
        attempt = next(
            (
                a
                for a in report.get("attempts") or ()
                if a.get("index") == report.get("chosen_attempt")
            ),
            {},
        )
    if backend == "poprt":
        return Measurement(f"PopRT on the IPUs of this host (target {name})", kind == "ipu")
    providers = [str(p) for p in ((attempt.get("details") or {}).get("providers") or ())]
    kinds = {_PROVIDER_KINDS.get(p, "?") for p in providers}
    shown = ", ".join(providers) or "its default provider"
    return Measurement(
        f"{backend} ({shown}) on the host that ran sharderd", bool(providers) and kinds == {kind}
    )


def shares(times: Sequence[float]) -> list[float]:
    """Each stage's fraction of the summed stage times (all 0 when nothing was timed)."""
    total = float(sum(times))
    return [float(t) / total if total > 0 else 0.0 for t in times]


def amp_of(report: Mapping[str, Any], attempt: Mapping[str, Any]) -> float | None:
    """``available_memory_proportion`` of a PopRT attempt; None for backends that have no such option."""
    if report.get("backend") != "poprt":
        return None
    amp = (attempt.get("options") or {}).get("available_memory_proportion")
    return None if amp is None else float(amp)
