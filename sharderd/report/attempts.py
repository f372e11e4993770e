"""An attempt's entry in report.json: what was compiled, with which options, and what it taught."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sharderd.report.build import serialization_list

if TYPE_CHECKING:
    from sharderd.job.attempts import AttemptRecord

__all__ = ["attempt_dict", "attempts_heading"]


def attempts_heading(backend: str) -> str:
    """The title over a report's attempts: only PopRT's are compiles."""
    if backend == "poprt":
        return "Compile attempts"
    return f"Attempts ({backend} runs: nothing was compiled)"


def _per_stage(record: AttemptRecord) -> dict[str, Any]:
    """``stage_available_memory_proportion``: each stage's AMP, when some stage has its own."""
    amps = record.key.stage_amps
    return {} if amps is None else {"stage_available_memory_proportion": list(amps)}


def _serialized(record: AttemptRecord) -> dict[str, Any]:
    """``matmul_serialization``: the MatMuls written with PopART's serialization, when any."""
    pairs = record.key.serialize
    return {"matmul_serialization": serialization_list(pairs)} if pairs else {}


def attempt_dict(record: AttemptRecord) -> dict[str, Any]:
    out = record.outcome
    data: dict[str, Any] = {
        "index": record.index,
        "label": record.label,
        "plan_digest": record.key.digest,
        "options": {
            "available_memory_proportion": record.key.amp,
            "safety_margin": record.margin,
            **_per_stage(record),
            **_serialized(record),
        },
        "memory_scale": list(record.scale),
        "predicted_bottleneck_s": record.predicted_s,
        "predicted_stage_times_s": [st.time_s for st in record.plan.stages]
        if record.plan is not None
        else [0.0] * len(record.views),
        "cost_model": "measured" if record.measured_times else "analytic",
        "outcome": out.outcome if out else "cancelled",
        "duration_s": out.duration_s if out else 0.0,
        "message": out.message
        if out
        else f"cancelled: {record.cancelled_because or 'the job stopped before it finished'}",
    }
    if out is not None:
        data["oom"] = (
            None
            if out.oom is None
            else {
                "kind": out.oom.kind,
                "device": out.oom.device,
                "tile": out.oom.tile,
                "bytes_used": out.oom.bytes_used,
            }
        )
        data["returncode"] = out.returncode
        data["signal"] = out.signal
        data["stderr_tail"] = out.stderr_tail[-4000:]
        data["benchmark"] = None if out.benchmark is None else out.benchmark.to_dict()
        details = dict(out.details) if out.details else None
        if details and "node_times_s" in details:
            details["node_times_s"] = f"{len(details['node_times_s'])} nodes profiled"
        data["details"] = details
    if record.correction is not None:
        c = record.correction
        data["correction"] = {
            "device": c.device,
            "measured_fraction": c.measured_fraction,
            "predicted_fraction": c.predicted_fraction,
            "scale_before": list(c.before),
            "scale_after": list(c.after),
            "reason": c.reason,
        }
    return data
