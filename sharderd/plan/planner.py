"""``plan_stages``: the best split of an analysed model onto N devices of a target, or a proof
(with numbers) that none fits."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sharderd.errors import ConfigError, PlanInfeasibleError
from sharderd.graph.analyze import Analysis
from sharderd.plan.order import candidate_orders
from sharderd.plan.partition import Partition, memory_window, solve
from sharderd.plan.profile import OrderedCosts, calibrated_compute_s, ordered_costs
from sharderd.plan.types import CutTensor, Plan, StageCost
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["lower_bound", "plan_stages"]


def lower_bound(oc: OrderedCosts, devices: int) -> float:
    """No split of any order beats this: perfect balance of node time, or the dearest node."""
    return max(float(oc.prefix_time[-1]) / devices, float(oc.node_time.max()))


def plan_stages(
    analysis: Analysis,
    target: Target,
    devices: int,
    *,
    safety_margin: float,
    memory_scale: Sequence[float] | None = None,
    orders: Sequence[str] | None = None,
    measured_s: np.ndarray | None = None,
) -> Plan:
    """Split into exactly ``devices`` pipeline stages, minimising the slowest stage.

    Stage s must satisfy ``memory × safety_margin × memory_scale[s] <= target.memory_bytes``.
    ``measured_s[node]`` (seconds, NaN where unknown) replaces the FLOP model's compute time
    (``cost_model = "measured"``). Raises ``PlanInfeasibleError`` (with the short device and the
    devices needed) when no split of any candidate order fits.
    """
    n = analysis.flow.num_nodes
    if devices < 1:
        raise ConfigError(f"--devices must be >= 1, got {devices}")
    if devices > n:
        raise ConfigError(f"--devices {devices} is more than the model's {n} node(s); every device needs work")
    scale = np.ones(devices) if memory_scale is None else np.asarray(memory_scale, dtype=np.float64)
    if len(scale) != devices or (scale <= 0).any():
        raise ValueError("memory_scale needs one positive factor per device")
    caps = target.memory_bytes / (safety_margin * scale)
    compute_s = calibrated_compute_s(analysis, target, measured_s)
    t0 = time.perf_counter()
    candidates = candidate_orders(analysis.flow)
    if orders is not None:
        candidates = {name: o for name, o in candidates.items() if name in orders} or candidates
    timings = {"orders": time.perf_counter() - t0}
    tried: dict[str, float | None] = {}
    best: tuple[Partition, OrderedCosts, str] | None = None
    first_oc: OrderedCosts | None = None
    for name, order in candidates.items():
        t1 = time.perf_counter()
        oc = ordered_costs(analysis, target, order, compute_s)
        first_oc = first_oc or oc
        require_costed = int(oc.costed.sum()) >= devices
        partition = solve(oc, caps, require_costed=require_costed)
        timings[f"solve.{name}"] = time.perf_counter() - t1
        tried[name] = None if partition is None else partition.bottleneck_s
        if partition is not None and (best is None or partition.bottleneck_s < best[0].bottleneck_s * (1 - 1e-9)):
            best = (partition, oc, name)
    if best is None:
        assert first_oc is not None
        error = _infeasible(analysis, first_oc, target, devices, safety_margin, scale)
        if safety_margin > 1.0 and error.min_devices is not None:
            require_costed = int(first_oc.costed.sum()) >= devices
            if solve(first_oc, target.memory_bytes / scale, require_costed=require_costed) is not None:
                error.fits_without_margin = True
                error.message += (
                    f" Without the safety margin ({safety_margin:g}) a split does fit the estimate: "
                    "`sharderd shard` with a compile backend tries it once."
                )
        raise error
    partition, oc, name = best
    overhead = target.op_overhead_s if measured_s is None else 0.0
    plan = _build_plan(analysis, oc, name, partition, target, caps, safety_margin, scale, overhead)
    timings["total"] = time.perf_counter() - t0
    return replace(plan, orders_tried=tried, timings_s=timings, probes=partition.probes)


def _build_plan(
    analysis: Analysis,
    oc: OrderedCosts,
    order_name: str,
    partition: Partition,
    target: Target,
    caps: np.ndarray,
    margin: float,
    scale: np.ndarray,
    overhead_per_node: float = 0.0,
) -> Plan:
    flow = analysis.flow
    bounds = partition.bounds
    assignment = np.empty(flow.num_nodes, dtype=np.int64)
    stages = []
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        assignment[oc.order[a:b]] = s
        weights, live, code = oc.stage_memory(a, b)
        comm_in = float(oc.cut_bytes[a]) / target.link_bytes_per_s
        comm_out = float(oc.cut_bytes[b]) / target.link_bytes_per_s
        comm = comm_in + comm_out
        total = oc.stage_time(a, b)
        host = 0.0 if oc.host_time is None else float(oc.host_time[a:b].sum())
        overhead = overhead_per_node * (b - a)
        stages.append(
            StageCost(
                index=s,
                start=a,
                stop=b,
                num_nodes=b - a,
                first_node=flow.node_names[oc.order[a]],
                last_node=flow.node_names[oc.order[b - 1]],
                flops=float(oc.flops[a:b].sum()),
                weight_bytes=weights,
                activation_bytes=live,
                code_bytes=code,
                recv_bytes=int(oc.cut_bytes[a]),
                send_bytes=int(oc.cut_bytes[b]),
                memory_bytes=weights + live + code,
                budget_bytes=int(caps[s]),
                capacity_bytes=target.memory_bytes,
                compute_s=total - comm,
                comm_s=comm,
                time_s=total,
                flops_s=total - comm - host - overhead,
                overhead_s=overhead,
                host_s=host,
                comm_in_s=comm_in,
                comm_out_s=comm_out,
            )
        )
    cut_tensors = []
    for c, position in enumerate(bounds[1:-1], start=1):
        crossing = np.flatnonzero((oc.producer_pos >= 0) & (oc.producer_pos < position) & (oc.last_pos >= position))
        for t in crossing.tolist():
            cut_tensors.append(CutTensor(c, flow.tensor_names[t], int(analysis.costs.tensor_bytes[t])))
    return Plan(
        devices=len(stages),
        order_name=order_name,
        order=oc.order,
        bounds=bounds,
        assignment=assignment,
        stages=tuple(stages),
        cut_tensors=tuple(cut_tensors),
        bottleneck_s=partition.bottleneck_s,
        lower_bound_s=lower_bound(oc, len(stages)),
        safety_margin=margin,
        memory_scale=tuple(float(x) for x in scale),
    )


def _infeasible(
    analysis: Analysis,
    oc: OrderedCosts,
    target: Target,
    devices: int,
    margin: float,
    scale: np.ndarray,
) -> PlanInfeasibleError:
    """Say which device is short, by how much, and how many devices would do."""
    capacity = target.memory_bytes
    factor = margin * scale
    # A node that cannot fit even alone rules out every split.
    per_ref = oc.weight_bytes[oc.w_idx].astype(np.float64)
    node_weights = np.zeros(oc.n)
    has = np.diff(oc.w_ptr) > 0
    if has.any():
        node_weights[has] = np.add.reduceat(per_ref, oc.w_ptr[:-1][has])
    single = node_weights + oc.live_bytes + oc.code_bytes_per_node
    # "How many devices would do" under what was learned: the typical (median) correction.
    typical = float(np.median(scale))
    worst = int(np.argmax(single))
    if single[worst] * margin * typical > capacity:
        w, live, code = oc.stage_memory(worst, worst + 1)
        node = analysis.flow.node_names[oc.order[worst]]
        learned = f" × correction {typical:.3g}" if typical != 1.0 else ""
        return PlanInfeasibleError(
            f"node {node!r} alone needs {fmt_bytes(single[worst] * margin * typical)} "
            f"(weights {fmt_bytes(w)}, activations {fmt_bytes(live)}, code {fmt_bytes(code)}, "
            f"× margin {margin:g}{learned}) but one {target.name} device holds {fmt_bytes(capacity)}: "
            "no number of pipeline stages can fit it",
            hint="reduce batch_size or the op's size, or use a target with more memory",
            device=None,
            short_bytes=int(single[worst] * margin * typical - capacity),
            min_devices=None,
        )
    base_lo = memory_window(oc, capacity / (margin * typical))
    needed = _greedy_stage_count(base_lo)
    windows: dict[float, np.ndarray] = {typical: base_lo}
    start = 0
    for s in range(devices):
        if float(scale[s]) not in windows:
            windows[float(scale[s])] = memory_window(oc, capacity / factor[s])
        end = int(np.searchsorted(windows[float(scale[s])], start, side="right") - 1)
        if end <= start:  # this device cannot hold even the next node: its correction forbids it
            node = analysis.flow.node_names[oc.order[start]]
            need = single[start] * factor[s]
            return PlanInfeasibleError(
                f"the model does not fit on {devices} × {target.name}: device {s} cannot hold node {node!r}, "
                f"which needs {fmt_bytes(need)} there (× margin {margin:g} × correction {scale[s]:.3g} "
                f"learned from the compiler) but the device holds {fmt_bytes(capacity)}",
                hint="the compiler's measurements say this part of the model needs a device to itself or more memory",
                device=s,
                short_bytes=int(need - capacity),
                min_devices=None,
            )
        if s < devices - 1:
            start = end
    last = devices - 1
    w, live, code = oc.stage_memory(start, oc.n)
    need = (w + live + code) * factor[last]
    short = int(need - capacity)
    return PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: even packed as tightly as possible, "
        f"device {last} would need {fmt_bytes(need)} (weights {fmt_bytes(w)}, activations "
        f"{fmt_bytes(live)}, code {fmt_bytes(code)}, × margin {margin:g}"
        + (f" × correction {scale[last]:.3g}" if scale[last] != 1.0 else "")
        + f") but holds {fmt_bytes(capacity)}: short by {fmt_bytes(max(short, 0))}. "
        f"At least {needed} devices are needed.",
        hint=f"rerun with --devices {needed} (or lower plan.safety_margin if you trust the estimate)",
        device=last,
        short_bytes=short,
        min_devices=needed,
    )


def _greedy_stage_count(lo: np.ndarray) -> int:
    """Fewest stages covering the order when memory is the only limit (greedy is exact: monotone)."""
    n = len(lo) - 1
    count, start = 0, 0
    while start < n:
        end = int(np.searchsorted(lo, start, side="right") - 1)
        if end <= start:
            return n + 1
        start = end
        count += 1
    return count
