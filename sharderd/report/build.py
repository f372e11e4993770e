"""Assemble ``report.json``: plain data, versioned, the single source the Markdown and HTML
renderings and other tools read."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx

from sharderd import __version__
from sharderd.graph.analyze import Analysis
from sharderd.plan.fewest import THROUGHPUT_BAND
from sharderd.plan.probe import SERIAL_MODE
from sharderd.plan.serialize_choice import BottleneckTrial
from sharderd.plan.types import BottleneckHolder, Plan
from sharderd.shard.annotate import RoutedInput
from sharderd.shard.serialize import Serialized
from sharderd.target import Target

__all__ = [
    "SCHEMA",
    "as_given",
    "model_facts",
    "nodes_phrase",
    "plan_section",
    "report_dict",
    "serialization_list",
    "target_facts",
    "trial_section",
]

SCHEMA = "sharderd.report/3"
"""Version 3 changes one meaning: ``status`` is ``verified``, no longer ``compiled``, when
onnxruntime proved the plan (``compiled`` now always means PopRT compiled it). Version 2 only added
keys to version 1: ``model.compiled_ops``, each stage's ``ops``, ``target.op_overhead_s_table`` /
``target.code_bytes_table``, ``verdict`` and ``verdict.contradiction`` (a compiled job whose compile
refuted a probe's proof). docs/report.md lists every version."""


def _value_info(value: onnx.ValueInfoProto) -> dict[str, Any]:
    tt = value.type.tensor_type
    dims: list[int | str] = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim
    ]
    known = tt.elem_type in onnx.TensorProto.DataType.values() and tt.elem_type != 0
    return {
        "name": value.name,
        "dtype": onnx.helper.tensor_dtype_to_string(tt.elem_type)
        if known
        else "unknown"
        if not tt.elem_type
        else f"unknown ({tt.elem_type})",
        "shape": dims,
    }


def as_given(model: dict[str, Any], given: Path) -> dict[str, Any]:
    """A report's ``model`` facts for a serialized copy, named as the user's own file (path, name,
    sha256): the report is about the model the user gave; its counts stay those of the graph that
    was planned."""
    with given.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {**model, "path": str(given), "name": given.name, "sha256": digest}


def model_facts(analysis: Analysis) -> dict[str, Any]:
    model = analysis.model
    loaded = analysis.loaded
    initializers = {t.name for t in model.graph.initializer}
    return {
        "path": str(loaded.path),
        "name": loaded.path.name,
        "sha256": loaded.sha256,
        "file_bytes": loaded.file_bytes,
        "ir_version": model.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": analysis.flow.num_nodes,
        "inputs": [_value_info(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [_value_info(v) for v in model.graph.output],
        "weight_bytes": analysis.total_weight_bytes,
        "external_bytes": loaded.external_bytes,
        "external_files": [asdict(f) for f in loaded.external_files],
        "flops": analysis.total_flops,
        "renamed_nodes": analysis.renamed_nodes,
        "resolved_dims": dict(analysis.shapes.resolved_dims),
        "unresolved_dims": list(analysis.shapes.unresolved_dims),
        "unknown_size_tensors": len(analysis.costs.unknown_tensors),
        "unknown_tensors": list(analysis.costs.unknown_tensors[:50]),
        "input_shapes": {k: list(v) for k, v in analysis.shapes.input_shapes.items()},
        "shape_inference": analysis.shapes.engine,
        "shape_rounds": analysis.shapes.rounds,
        "shape_stops": [asdict(s) for s in analysis.shapes.stops],
        "data_dependent_shapes": [asdict(d) for d in analysis.shapes.data_dependent],
        "precision": analysis.precision,
        "source_precision": analysis.source_precision,
        "folded_nodes": analysis.folded_nodes,
        "folded_bytes": analysis.folded_bytes,
        "compiled_ops": analysis.compiled_ops,
    }


def nodes_phrase(model: Mapping[str, Any]) -> str:
    """ "N nodes in the file, F folded, C ops compiled" (reports before ``compiled_ops``: N nodes)."""
    if "compiled_ops" not in model:
        return f"{model['nodes']} nodes"
    return (
        f"{model['nodes']} nodes in the file, {model['folded_nodes']} folded, "
        f"{model['compiled_ops']} ops compiled"
    )


def target_facts(target: Target) -> dict[str, Any]:
    """The target's fields, plus the per-op-type tables the plan priced compiled nodes with (op
    types not listed cost ``op_overhead_s`` and ``code_bytes_per_node``)."""
    return {
        **asdict(target),
        "op_overhead_s_table": target.overhead_table(),
        "code_bytes_table": target.code_table(),
    }


def held_dict(holder: BottleneckHolder | None) -> dict[str, Any] | None:
    """``plan.bottleneck_held_by``: the cost no split can move that dominates the slowest stage."""
    if holder is None:
        return None
    return {**asdict(holder), "tensors": list(holder.tensors), "description": holder.describe()}


def plan_section(
    plan: Plan,
    batch_size: int,
    routed: Sequence[RoutedInput] = (),
    stage_amps: Sequence[float] | None = None,
    matmul_serialization: Sequence[tuple[str, int]] = (),
) -> dict[str, Any]:
    """``stage_amps``: each stage's ``available_memory_proportion`` as compiled (PopRT only),
    added to its stage as ``available_memory_proportion``; ``matmul_serialization``: the MatMuls
    written with PopART's serialization, (node, factor)."""
    stages = [asdict(s) for s in plan.stages]
    for stage in stages:  # the slowest is 1.0; idle time of a device is 1 - its utilisation
        stage["utilisation"] = stage["time_s"] / plan.bottleneck_s if plan.bottleneck_s > 0 else 1.0
    if stage_amps is not None:
        for stage, amp in zip(stages, stage_amps, strict=True):
            stage["available_memory_proportion"] = amp
    cuts: dict[int, list[dict[str, Any]]] = {}
    for ct in plan.cut_tensors:
        cuts.setdefault(ct.cut, []).append({"name": ct.name, "bytes": ct.bytes})
    return {
        "devices": plan.devices,
        "digest": plan.digest,
        "order": plan.order_name,
        "orders_tried": dict(plan.orders_tried),
        "method": plan.method,
        "proven_optimal": plan.proven_optimal,
        "claim": plan.claim,
        "bottleneck_s": plan.bottleneck_s,
        "lower_bound_s": plan.lower_bound_s,
        "ratio_to_bound": plan.ratio_to_bound,
        "predicted_throughput_per_s": batch_size / plan.bottleneck_s
        if plan.bottleneck_s > 0
        else None,
        "safety_margin": plan.safety_margin,
        "memory_scale": list(plan.memory_scale),
        "slowest_stage": plan.slowest_stage,
        "bottleneck_held_by": held_dict(plan.held_by),
        "fewest_devices": plan.fewest_devices,
        "fewest_devices_bottleneck_s": plan.fewest_bottleneck_s,
        "fewest_devices_band": THROUGHPUT_BAND,
        "max_devices": plan.max_devices,
        "stages": stages,
        "cuts": [
            {"cut": c, "bytes": sum(t["bytes"] for t in tensors), "tensors": tensors}
            for c, tensors in sorted(cuts.items())
        ],
        "routed_inputs": [asdict(r) for r in routed],
        "matmul_serialization": serialization_list(matmul_serialization),
        "planner": {"probes": plan.probes, "timings_s": dict(plan.timings_s)},
    }


def report_dict(
    *,
    model: Mapping[str, Any],
    warnings: Sequence[str],
    target: Target,
    plan: Mapping[str, Any] | None,
    batch_size: int,
    status: str,
    backend: str = "none",
    attempts: Sequence[Mapping[str, Any]] = (),
    outputs: Mapping[str, Any] | None = None,
    timings_s: Mapping[str, float] | None = None,
    error: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    contradiction: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``status``: ``planned``, ``not_compiled`` (backend none), ``compiled`` (PopRT compiled it),
    ``verified`` (onnxruntime ran the stages and checked their outputs; ``compiled`` before
    ``sharderd.report/3``), ``failed``, ``does_not_fit`` (proven), ``not_proven`` (no fitting split
    found, not proven); ``plan`` is a
    ``plan_section``. ``verdict`` says, for a job that ended without a split, whether that is
    proven and on which of ``errors.GROUNDS``; for a compiled job it is None, unless a compile
    ``contradiction`` refuted a probe's proof (``proven`` false, the compile won)."""
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "sharderd_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "status": status,
        "backend": backend,
        "model": dict(model),
        "target": target_facts(target),
        "batch_size": batch_size,
        "plan": None if plan is None else dict(plan),
        "attempts": list(attempts),
        "outputs": dict(outputs or {}),
        "timings_s": dict(timings_s or {}),
        "warnings": list(warnings),
        "error": None if error is None else dict(error),
        "verdict": None
        if error is None or "proven" not in error
        else {"proven": bool(error["proven"]), "grounds": error.get("grounds")},
    }
    if contradiction is not None:
        report["verdict"] = {"proven": False, "grounds": None, "contradiction": dict(contradiction)}
    if extra:
        report.update(extra)
    return report


def serialized_section(
    records: Sequence[Serialized], stages: Mapping[str, int]
) -> list[dict[str, Any]]:
    """``report["serialized"]``: each node rewritten into pieces, why, and the stage of each piece
    (for ``bottleneck``: the predicted bottleneck of the first plan before and after)."""
    return [
        {
            "node": r.node,
            "op": r.op,
            "kind": r.kind,
            "pieces": r.pieces,
            "piece_nodes": list(r.piece_nodes),
            "stages": [stages.get(n) for n in r.piece_nodes],
            "reason": r.reason,
            "bottleneck_before_s": None if r.bottleneck_s is None else r.bottleneck_s[0],
            "bottleneck_after_s": None if r.bottleneck_s is None else r.bottleneck_s[1],
        }
        for r in records
    ]


def trial_section(trial: BottleneckTrial) -> list[dict[str, Any]]:
    """``report["serialization_tried"]``: the rewrite for the bottleneck that was priced, kept or
    not: each node and its pieces, the first plan's predicted bottleneck whole, the floor no split
    in pieces beats, whether a plan in pieces was made (not when the floor already rules the
    rewrite out) and its bottleneck (None: not made, or no split fits), and whether it was kept."""
    return [
        {
            "nodes": [{"node": n, "op": op, "pieces": k} for n, op, k in trial.pieces],
            "bottleneck_before_s": trial.before_s,
            "after_lower_bound_s": trial.floor_s,
            "after_planned": trial.planned,
            "bottleneck_after_s": trial.after_s,
            "kept": trial.kept,
        }
    ]


def serialization_list(pairs: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """``plan.matmul_serialization`` / ``attempts[].options.matmul_serialization``: each MatMul
    written with PopART's ``__serialize_matmul_mode`` / ``__serialize_matmul_factor``."""
    return [{"node": name, "mode": SERIAL_MODE, "factor": k} for name, k in pairs]
