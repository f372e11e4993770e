"""The engine's front door: file → analysis → plan → annotated files. Pure computation plus the
model's own I/O; no logging, no global state. The CLI and the daemon call only these."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from sharderd.config import PlanConfig
from sharderd.errors import SharderdError
from sharderd.fsutil import atomic_write
from sharderd.graph.analyze import Analysis, analyze
from sharderd.graph.load import load_model
from sharderd.plan.content import ContentCorrection
from sharderd.plan.fewest import FITTING_SEARCH, fewest_devices, first_fitting
from sharderd.plan.ordered_costs import calibrated_compute_s
from sharderd.plan.planner import plan_stages
from sharderd.plan.types import Plan
from sharderd.shard.amp import set_stage_amps
from sharderd.shard.annotate import RoutedInput, annotate, check_annotation
from sharderd.shard.convert import fix_static_shapes, to_fp16
from sharderd.shard.matmul_serial import set_serialization
from sharderd.shard.poprt_config import manual_sharding_yaml
from sharderd.shard.write import copy_external_data, link_in_file, write_converted, write_model
from sharderd.target import Target

__all__ = [
    "ShardFiles",
    "analyze_file",
    "annotated_model",
    "fitting_devices",
    "make_auto_plan",
    "make_plan",
    "with_fewest",
    "write_shard_files",
]


@dataclass(frozen=True, slots=True)
class ShardFiles:
    model: Path
    sharding_yaml: Path
    external: tuple[Path, ...]
    routed: tuple[RoutedInput, ...]


def analyze_file(path: Path, config: PlanConfig) -> Analysis:
    return analyze(load_model(path), config)


def make_plan(
    analysis: Analysis,
    target: Target,
    devices: int,
    config: PlanConfig,
    *,
    memory_scale: Sequence[float] | None = None,
    safety_margin: float | None = None,
    orders: Sequence[str] | None = None,
    measured_times: Mapping[str, float] | None = None,
    content: ContentCorrection | None = None,
    fewest: bool = True,
) -> Plan:
    """Plan with the config's margin; ``measured_times`` (node name → seconds) replaces FLOPs;
    ``content`` corrects the bytes of nodes compiles measured. With ``fewest`` and without learned
    corrections the plan also says the fewest devices that keep its predicted throughput
    (``plan.fewest``: more plans, only when the lower bound leaves room for fewer devices)."""
    measured = _measured(analysis, measured_times)
    margin = config.safety_margin if safety_margin is None else safety_margin

    def plan_on(count: int) -> Plan:
        return plan_stages(
            analysis,
            target,
            count,
            safety_margin=margin,
            memory_scale=memory_scale,
            orders=orders,
            measured_s=measured,
            content=content,
        )

    plan = plan_on(devices)
    if not fewest or memory_scale is not None or content is not None or plan.method == "overfull":
        return plan
    return _with_fewest(analysis, target, plan, plan_on, measured)[0]


def with_fewest(analysis: Analysis, target: Target, plan: Plan, config: PlanConfig) -> Plan:
    """``plan``, made by ``make_plan(..., fewest=False)`` with nothing but ``config``, with its
    fewest devices filled in as ``make_plan`` fills them in."""
    if plan.method == "overfull":
        return plan

    def plan_on(count: int) -> Plan:
        return plan_stages(analysis, target, count, safety_margin=config.safety_margin)

    return _with_fewest(analysis, target, plan, plan_on, None)[0]


def fitting_devices(
    analysis: Analysis, target: Target, devices: int, config: PlanConfig
) -> tuple[int | None, int]:
    """After no split fitted on ``devices``: the fewest more devices on which the planner finds one
    (``fewest.first_fitting``), or None, and the last count tried."""
    last = min(devices + FITTING_SEARCH, analysis.flow.num_nodes)
    found = first_fitting(
        devices, lambda count: make_plan(analysis, target, count, config, fewest=False), last
    )
    return found, last


def make_auto_plan(
    analysis: Analysis,
    target: Target,
    max_devices: int,
    config: PlanConfig,
    *,
    orders: Sequence[str] | None = None,
    measured_times: Mapping[str, float] | None = None,
) -> Plan:
    """``--devices auto``: plan on at most ``max_devices`` (and at most one per node), then on the
    fewest devices whose predicted throughput is within ``THROUGHPUT_BAND`` of that plan's, so the
    other devices stay free. The plan says so (``Plan.max_devices``)."""
    measured = _measured(analysis, measured_times)

    def plan_on(count: int) -> Plan:
        return plan_stages(
            analysis,
            target,
            count,
            safety_margin=config.safety_margin,
            orders=orders,
            measured_s=measured,
        )

    widest = plan_on(max(1, min(max_devices, analysis.flow.num_nodes)))
    if widest.method == "overfull":
        return replace(widest, max_devices=max_devices)
    found, chosen = _with_fewest(analysis, target, widest, plan_on, measured)
    return replace(
        chosen,
        fewest_devices=found.fewest_devices,
        fewest_bottleneck_s=chosen.bottleneck_s,
        max_devices=max_devices,
        timings_s={
            **chosen.timings_s,
            **{k: v for k, v in found.timings_s.items() if k.startswith("fewest")},
        },
    )


def _measured(analysis: Analysis, measured_times: Mapping[str, float] | None) -> np.ndarray | None:
    if not measured_times:
        return None
    return np.array(
        [measured_times.get(name, np.nan) for name in analysis.flow.node_names], dtype=np.float64
    )


def _with_fewest(
    analysis: Analysis,
    target: Target,
    plan: Plan,
    plan_on: Callable[[int], Plan],
    measured: np.ndarray | None,
) -> tuple[Plan, Plan]:
    """``plan`` with its fewest devices filled in, and the plan on that many devices."""
    t0 = time.perf_counter()
    compute_s = calibrated_compute_s(analysis, target, measured)
    found = fewest_devices(analysis, target, compute_s, plan, plan_on)
    timings = {
        **plan.timings_s,
        "fewest_devices": time.perf_counter() - t0,
        "fewest_devices_plans": float(len(found.planned)),
    }
    marked = replace(
        plan,
        fewest_devices=found.devices,
        fewest_bottleneck_s=found.plan.bottleneck_s,
        timings_s=timings,
    )
    return marked, found.plan


def annotated_model(
    analysis: Analysis, plan: Plan
) -> tuple[onnx.ModelProto, tuple[RoutedInput, ...]]:
    """A copy of the model carrying the plan, at the planned input shapes (unless ``keep_dynamic``);
    the analysed proto stays untouched for re-planning."""
    if analysis.priced:  # a caller bug: the rewrite must be written (serialize_node) first
        raise SharderdError("internal error: a priced rewrite has no weights to write")
    model = onnx.ModelProto()
    model.CopyFrom(analysis.model)
    routed = annotate(model, analysis.flow, plan.assignment)
    if not analysis.config.keep_dynamic:
        fix_static_shapes(model, analysis.shapes.input_shapes, analysis.shapes.types)
    _check(model)
    return model, routed


def _check(model: onnx.ModelProto) -> None:
    problems = check_annotation(model)
    if problems:  # a planner bug, never a user error: fail loudly with the evidence
        raise SharderdError(
            f"internal error: the annotated model breaks PopART's rules: {problems[:3]}"
        )


def write_shard_files(
    analysis: Analysis,
    plan: Plan,
    out_dir: Path,
    stem: str,
    *,
    link_external: bool = False,
    stage_amps: Sequence[float | None] | None = None,
    matmul_serialization: Mapping[str, int] | None = None,
) -> ShardFiles:
    """Write ``<stem>.sharded.onnx`` (+ its external data) and ``<stem>.sharding.yaml``.

    At ``fp16`` (planned from an fp32 file) the weights are converted, so they are written anew:
    inline, or as ``<stem>.sharded.data`` beside the model when they pass protobuf's 2 GiB.
    Otherwise inline weights stay inline, streamed from the user's file, and data files are
    copied; with ``link_external`` (a compile attempt) both are reached through links instead.
    ``stage_amps[s]`` (None: the session's option) goes on stage ``s``'s conv/matmul nodes as
    ``__available_memory`` (``shard.amp``); each MatMul named in ``matmul_serialization`` gets
    PopART's ``__serialize_matmul_mode``/``__serialize_matmul_factor`` (``shard.matmul_serial``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    model, routed = annotated_model(analysis, plan)
    model_path = out_dir / f"{stem}.sharded.onnx"
    converting = analysis.precision == "fp16" and analysis.source_precision != "fp16"
    if converting:
        model, _ = to_fp16(model, analysis.loaded.path.parent)
        _check(model)
    set_stage_amps(model, stage_amps or ())
    set_serialization(model, matmul_serialization or {})
    yaml_path = out_dir / f"{stem}.sharding.yaml"
    if converting:
        external = write_converted(model, model_path)
    else:
        files = analysis.loaded.external_files
        external = copy_external_data(
            files, analysis.loaded.path.parent, out_dir, link=link_external
        )
        if link_external:  # the attempt reads inline weights from the user's file, through a link
            taken = {model_path.name, yaml_path.name, *(f.location for f in files)}
            external += link_in_file(model, out_dir, taken)
        write_model(model, model_path)
    atomic_write(yaml_path, manual_sharding_yaml(model))
    return ShardFiles(model_path, yaml_path, tuple(external), routed)
