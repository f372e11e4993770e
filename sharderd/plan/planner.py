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
from sharderd.plan.bounds import lower_bound_all_splits, memory_floor
from sharderd.plan.ideals import solve_ideals
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import OrderedCosts, calibrated_compute_s, ordered_costs
from sharderd.plan.partition import Partition, solve
from sharderd.plan.types import CutTensor, Plan, StageCost
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["LEVEL_ORDER_GAIN", "lower_bound", "plan_stages"]

LEVEL_ORDER_GAIN = 0.01
"""The level order replaces the file/depth-first plan only when it is this much faster: it exists
for splits across parallel branches (often 10%+), and a hair's gain is not worth a stage boundary
inside a block instead of at a layer's end."""


def lower_bound(oc: OrderedCosts, devices: int) -> float:
    """No split of this order beats this: perfect balance of node time, or the dearest node.

    Host input is charged to the first reader in ``oc``'s order, so this holds for that order only;
    ``bounds.lower_bound_all_splits`` is the bound over every valid split (the one plans report).
    """
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
    (``cost_model = "measured"``). Small DAGs are solved exactly over every valid split (DP over
    ideals); larger ones on each candidate order. Without ``memory_scale`` it raises
    ``PlanInfeasibleError`` only with a proof that no valid split fits; when the order search finds
    none but cannot prove it, the least overfull split comes back (``method == "overfull"``) for a
    compile to decide. With learned corrections it raises (saying the search was not exhaustive),
    so the compile search's own least-overfull retry decides.
    """
    n = analysis.flow.num_nodes
    if devices < 1:
        raise ConfigError(f"--devices must be >= 1, got {devices}")
    if devices > n:
        raise ConfigError(
            f"--devices {devices} is more than the model's {n} node(s); every device needs work"
        )
    scale = np.ones(devices) if memory_scale is None else np.asarray(memory_scale, dtype=np.float64)
    if len(scale) != devices or (scale <= 0).any():
        raise ValueError("memory_scale needs one positive factor per device")
    caps = target.memory_bytes / (safety_margin * scale)
    compute_s = calibrated_compute_s(analysis, target, measured_s)
    t0 = time.perf_counter()
    candidates = candidate_orders(analysis.flow)
    reference = next(iter(candidates.values()))
    if orders is not None:
        candidates = {name: o for name, o in candidates.items() if name in orders} or candidates
    timings = {"orders": time.perf_counter() - t0}
    bound = lower_bound_all_splits(analysis, target, compute_s, devices)
    costed = (analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)
    require_costed = int(costed.sum()) >= devices

    overhead = target.op_overhead_s if measured_s is None else 0.0
    t1 = time.perf_counter()
    exact = solve_ideals(
        analysis, target, compute_s, reference, caps, require_costed=require_costed
    )
    timings["solve.ideals"] = time.perf_counter() - t1
    if exact is not None:
        if exact.assignment is None:
            raise _infeasible_exact(
                analysis, target, compute_s, reference, devices, safety_margin, scale, exact.ideals
            )
        order = _canonical_order(exact.assignment, reference)
        oc = ordered_costs(analysis, target, order, compute_s)
        bounds = (0, *np.cumsum(np.bincount(exact.assignment, minlength=devices)).tolist())
        partition = Partition(
            bounds=tuple(int(b) for b in bounds),
            bottleneck_s=max(oc.stage_time(a, b) for a, b in itertools.pairwise(bounds)),
            probes=0,
        )
        plan = _build_plan(
            analysis,
            oc,
            "ideals",
            partition,
            target,
            caps,
            safety_margin,
            scale,
            bound=bound,
            overhead_per_node=overhead,
        )
        timings["total"] = time.perf_counter() - t0
        return replace(
            plan,
            timings_s=timings,
            method="ideals",
            proven_optimal=True,
            orders_tried={"ideals": partition.bottleneck_s},
        )

    tried: dict[str, float | None] = {}
    best: tuple[Partition, OrderedCosts, str] | None = None
    first_oc: OrderedCosts | None = None
    for name, order in candidates.items():
        t1 = time.perf_counter()
        oc = ordered_costs(analysis, target, order, compute_s)
        first_oc = first_oc or oc
        partition = solve(oc, caps, require_costed=require_costed)
        timings[f"solve.{name}"] = time.perf_counter() - t1
        tried[name] = None if partition is None else partition.bottleneck_s
        gain = LEVEL_ORDER_GAIN if name == "level" else 1e-9
        if partition is not None and (
            best is None or partition.bottleneck_s < best[0].bottleneck_s * (1 - gain)
        ):
            best = (partition, oc, name)
    if best is None:
        assert first_oc is not None
        proof = _infeasible_proof(analysis, target, devices, safety_margin, scale)
        if proof is not None:
            if safety_margin > 1.0 and proof.min_devices is not None:
                loose = target.memory_bytes / scale
                for order in candidates.values():
                    if solve(
                        ordered_costs(analysis, target, order, compute_s),
                        loose,
                        require_costed=require_costed,
                    ):
                        proof.fits_without_margin = True
                        proof.message += (
                            f" Without the safety margin ({safety_margin:g}) a split does fit the estimate: "
                            "`sharderd shard` with a compile backend tries it once."
                        )
                        break
            raise proof
        if memory_scale is not None:
            # Corrections learned from compiles rule these orders out; the compile search owns
            # what to try next (its least overfull retry), so say what was and was not searched.
            raise PlanInfeasibleError(
                f"no split along the {', '.join(candidates)} order(s) fits {devices} × {target.name} under the "
                f"learned corrections {', '.join(f'{x:.3g}' for x in scale)} at margin {safety_margin:g} "
                "(the order search is not exhaustive over DAG splits, so this is no proof for the model alone)",
                hint="the compile search retries its least overfull split; more devices leave room",
                device=int(np.argmax(scale)),
            )
        partition, oc = _least_overfull(first_oc, caps, require_costed)
        plan = _build_plan(
            analysis,
            oc,
            next(iter(candidates)),
            partition,
            target,
            caps,
            safety_margin,
            scale,
            bound=bound,
            overhead_per_node=overhead,
        )
        timings["total"] = time.perf_counter() - t0
        return replace(
            plan, orders_tried=tried, timings_s=timings, probes=partition.probes, method="overfull"
        )
    partition, oc, name = best
    plan = _build_plan(
        analysis,
        oc,
        name,
        partition,
        target,
        caps,
        safety_margin,
        scale,
        bound=bound,
        overhead_per_node=overhead,
    )
    timings["total"] = time.perf_counter() - t0
    proven = bool(partition.bottleneck_s <= bound * (1 + 1e-9))
    return replace(
        plan,
        orders_tried=tried,
        timings_s=timings,
        probes=partition.probes,
        method="orders",
        proven_optimal=proven,
    )


def _canonical_order(assignment: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Stages one after the other, each in the reference order: how the memory model reads a split."""
    rank = np.empty(len(reference), dtype=np.int64)
    rank[reference] = np.arange(len(reference))
    return np.lexsort((rank, assignment)).astype(np.int64)


def _least_overfull(
    oc: OrderedCosts, caps: np.ndarray, require_costed: bool
) -> tuple[Partition, OrderedCosts]:
    """The split of ``oc``'s order that fits the smallest uniform growth of every cap."""
    lo, hi = 1.0, 2.0
    while solve(oc, caps * hi, require_costed=require_costed) is None:
        lo, hi = hi, hi * 2
        assert hi < 2.0**80, "some split of an order fits once the caps are large enough"
    for _ in range(30):
        mid = (lo + hi) / 2
        if solve(oc, caps * mid, require_costed=require_costed) is None:
            lo = mid
        else:
            hi = mid
    found = solve(oc, caps * hi, require_costed=require_costed)
    assert found is not None
    return found, oc


def _build_plan(
    analysis: Analysis,
    oc: OrderedCosts,
    order_name: str,
    partition: Partition,
    target: Target,
    caps: np.ndarray,
    margin: float,
    scale: np.ndarray,
    *,
    bound: float,
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
        crossing = np.flatnonzero(
            (oc.producer_pos >= 0) & (oc.producer_pos < position) & (oc.last_pos >= position)
        )
        for t in crossing.tolist():
            cut_tensors.append(
                CutTensor(c, flow.tensor_names[t], int(analysis.costs.tensor_bytes[t]))
            )
    return Plan(
        devices=len(stages),
        order_name=order_name,
        order=oc.order,
        bounds=bounds,
        assignment=assignment,
        stages=tuple(stages),
        cut_tensors=tuple(cut_tensors),
        bottleneck_s=partition.bottleneck_s,
        lower_bound_s=bound,
        safety_margin=margin,
        memory_scale=tuple(float(x) for x in scale),
    )


def _node_too_large(
    analysis: Analysis, target: Target, margin: float, typical: float
) -> PlanInfeasibleError | None:
    """A node that cannot fit even alone (its weights, inputs, outputs and code) rules out every split."""
    floor = memory_floor(analysis, target)
    capacity = target.memory_bytes
    worst = int(np.argmax(floor.node_bytes))
    need = float(floor.node_bytes[worst]) * margin * typical
    if need <= capacity:
        return None
    node = analysis.flow.node_names[worst]
    learned = f" × correction {typical:.3g}" if typical != 1.0 else ""
    return PlanInfeasibleError(
        f"node {node!r} alone needs {fmt_bytes(need)} (its weights, inputs, outputs and code, "
        f"× margin {margin:g}{learned}) but one {target.name} device holds {fmt_bytes(capacity)}: "
        "no number of pipeline stages can fit it",
        hint="reduce batch_size or the op's size, or use a target with more memory",
        device=None,
        short_bytes=int(need - capacity),
        min_devices=None,
    )


def _infeasible_proof(
    analysis: Analysis, target: Target, devices: int, margin: float, scale: np.ndarray
) -> PlanInfeasibleError | None:
    """Facts that rule out every split without searching them, or None (the search was not a proof)."""
    typical = float(np.median(scale))
    too_large = _node_too_large(analysis, target, margin, typical)
    if too_large is not None:
        return too_large
    floor = memory_floor(analysis, target)
    caps = target.memory_bytes / (margin * scale)
    if floor.total_bytes <= caps.sum():
        return None
    needed = floor.min_devices(target.memory_bytes / (margin * typical))
    short = int((floor.total_bytes - caps.sum()) * margin * typical)
    return PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: its distinct weights and per-node code "
        f"alone need {fmt_bytes(floor.total_bytes * margin)} (× margin {margin:g}), more than the "
        f"{devices} devices' {fmt_bytes(caps.sum() * margin)} together: short by {fmt_bytes(max(short, 0))}. "
        f"At least {needed} devices are needed.",
        hint=f"rerun with --devices {max(needed, devices + 1)} (or lower plan.safety_margin if you trust the estimate)",
        device=None,
        short_bytes=short,
        min_devices=needed,
    )


def _infeasible_exact(
    analysis: Analysis,
    target: Target,
    compute_s: np.ndarray,
    reference: np.ndarray,
    devices: int,
    margin: float,
    scale: np.ndarray,
    ideals: int,
) -> PlanInfeasibleError:
    """Every valid split was checked and none fits: say so, and how many devices do fit."""
    typical = float(np.median(scale))
    too_large = _node_too_large(analysis, target, margin, typical)
    if too_large is not None:
        return too_large
    n = analysis.flow.num_nodes
    costed = (analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)
    needed = None
    floor = memory_floor(analysis, target).min_devices(target.memory_bytes / (margin * typical))
    for more in range(max(devices + 1, floor), n + 1):
        caps = np.full(more, target.memory_bytes / (margin * typical))
        found = solve_ideals(
            analysis, target, compute_s, reference, caps, require_costed=int(costed.sum()) >= more
        )
        if found is not None and found.assignment is not None:
            needed = more
            break
    error = PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: none of its valid splits (every split "
        f"over its {ideals} ideals was checked) fits the devices' memory at margin {margin:g}"
        + (
            f" with the learned corrections {', '.join(f'{x:.3g}' for x in scale)}"
            if (scale != 1.0).any()
            else ""
        )
        + (f". At least {needed} devices are needed." if needed is not None else "."),
        hint=f"rerun with --devices {needed}"
        if needed is not None
        else "use a target with more memory",
        device=None,
        min_devices=needed,
    )
    if margin > 1.0:
        caps = target.memory_bytes / scale
        found = solve_ideals(
            analysis,
            target,
            compute_s,
            reference,
            caps,
            require_costed=int(costed.sum()) >= devices,
        )
        if found is not None and found.assignment is not None:
            error.fits_without_margin = True
            error.message += (
                f" Without the safety margin ({margin:g}) a split does fit the estimate: "
                "`sharderd shard` with a compile backend tries it once."
            )
    return error
