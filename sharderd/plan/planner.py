"""``plan_stages``: the best split of an analysed model onto N devices of a target, or a proof
(with numbers) that none fits."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sharderd.errors import ConfigError, NoSplitError, NotProvenError
from sharderd.graph.analyze import Analysis
from sharderd.plan.balance_order import balance_order
from sharderd.plan.beyond_orders import DP_GAIN, improve
from sharderd.plan.bounds import lower_bound_all_splits
from sharderd.plan.build import build_plan, costed_split
from sharderd.plan.claims import LEXICOGRAPHIC, order_balance_claim
from sharderd.plan.content import ContentCorrection, corrected_analysis
from sharderd.plan.held import held_by
from sharderd.plan.ideals import solve_ideals
from sharderd.plan.infeasible import infeasible_exact, infeasible_proof, weights_proof
from sharderd.plan.op_costs import node_overhead_s
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import OrderedCosts, calibrated_compute_s, ordered_costs
from sharderd.plan.partition import Partition, solve
from sharderd.plan.problem import Problem
from sharderd.plan.types import Plan
from sharderd.target import Target

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
    memory_scale: Sequence[float] | np.ndarray | None = None,
    orders: Sequence[str] | None = None,
    measured_s: np.ndarray | None = None,
    content: ContentCorrection | None = None,
) -> Plan:
    """Split into exactly ``devices`` pipeline stages, minimising the slowest stage.

    Raises ``PlanInfeasibleError`` (exit 3) only on a proof that holds for the real compiler
    (``infeasible.weights_proof``: the weights alone); when its estimates rule every split out,
    or its search finds none under learned corrections, ``NotProvenError`` (exit 5). The rest is
    ``_search``'s.
    """
    if 1 <= devices <= analysis.flow.num_nodes:
        proof = weights_proof(analysis, target, devices)
        if proof is not None:
            raise proof
    plan = _search(
        analysis,
        target,
        devices,
        safety_margin=safety_margin,
        memory_scale=memory_scale,
        orders=orders,
        measured_s=measured_s,
        content=content,
    )
    compute_s = calibrated_compute_s(analysis, target, measured_s)
    return replace(plan, held_by=held_by(analysis, target, compute_s, plan))


def _search(
    analysis: Analysis,
    target: Target,
    devices: int,
    *,
    safety_margin: float,
    memory_scale: Sequence[float] | np.ndarray | None = None,
    orders: Sequence[str] | None = None,
    measured_s: np.ndarray | None = None,
    content: ContentCorrection | None = None,
) -> Plan:
    """The best split of the estimate, or ``NotProvenError``.

    ``content`` (factors on the bytes of nodes a compile measured, ``plan.content``) plans on the
    corrected sizes and is a learned correction like ``memory_scale``.

    Stage s must satisfy ``memory × safety_margin × memory_scale[s] <= target.memory_bytes``.
    ``measured_s[node]`` (seconds, NaN where unknown) replaces the FLOP model's compute time
    (``cost_model = "measured"``). Small DAGs are solved exactly over every valid split (DP over
    ideals); larger ones on each candidate order. Without ``memory_scale`` it raises only when the
    estimate rules every split out; when the order search finds none but the estimate does not
    rule them out, the least overfull split comes back (``method == "overfull"``) for a compile to
    decide. With learned corrections it raises (saying the search was not exhaustive), so the
    compile search decides what to try next.
    """
    if content is not None and not content.identity:
        return _plan_corrected(
            analysis,
            target,
            devices,
            safety_margin=safety_margin,
            memory_scale=memory_scale,
            orders=orders,
            measured_s=measured_s,
            content=content,
        )
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

    overhead = node_overhead_s(analysis, target) if measured_s is None else None
    problem = Problem(analysis, target, compute_s, reference, caps, require_costed)

    def plan_of(oc: OrderedCosts, name: str, partition: Partition) -> Plan:
        return build_plan(
            analysis,
            oc,
            name,
            partition,
            target,
            caps,
            safety_margin,
            scale,
            bound=bound,
            overhead_s=overhead,
        )

    def plan_of_split(assignment: np.ndarray, method: str) -> Plan:
        oc, partition = costed_split(problem, assignment)
        plan = plan_of(oc, method, partition)
        return replace(plan, method=method, orders_tried={method: partition.bottleneck_s})

    t1 = time.perf_counter()
    exact = solve_ideals(
        analysis, target, compute_s, reference, caps, require_costed=require_costed
    )
    timings["solve.ideals"] = time.perf_counter() - t1
    if exact is not None:
        if exact.assignment is None:
            raise infeasible_exact(
                analysis, target, compute_s, reference, devices, safety_margin, scale, exact.ideals
            )
        plan = plan_of_split(exact.assignment, "ideals")
        timings["total"] = time.perf_counter() - t0
        return replace(
            plan,
            timings_s=timings,
            proven_optimal=True,
            claim=f"optimal over every valid split (DP over all {exact.ideals} ideals){LEXICOGRAPHIC}",
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
    upper = np.inf if best is None else best[0].bottleneck_s
    # No split beats the bound, so a plan within DP_GAIN of it leaves the DPs nothing to gain.
    met = best is not None and upper <= bound * (1 + DP_GAIN)
    proof = (
        infeasible_proof(analysis, target, devices, safety_margin, scale) if best is None else None
    )
    found = improve(
        problem,
        start=None if best is None else (best[1].order, best[0].bounds, best[2]),
        upper=upper,
        skip=(
            f"it is within {upper / bound - 1:.2%} of the lower bound, so no valid split is "
            f"{DP_GAIN:.0%} faster"
            if met
            else "the estimate rules every split out"
            if proof is not None
            else "the DPs over the whole graph are not run under learned corrections"
            if memory_scale is not None
            else None
        ),
    )
    timings.update(found.timings_s)
    if found.assignment is not None:
        plan = plan_of_split(found.assignment, found.method)
        tried[plan.method] = plan.bottleneck_s
        timings["total"] = time.perf_counter() - t0
        meets = _meets(plan.bottleneck_s, bound)
        return replace(
            plan,
            orders_tried=tried,
            timings_s=timings,
            proven_optimal=found.proven or meets,
            claim=found.claim
            + (
                "; it meets the lower bound, so no valid split is faster"
                if meets and not found.proven
                else ""
            ),
        )
    searched = found.claim
    if best is None:
        assert first_oc is not None
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
            raise NotProvenError(
                f"no fitting split found (not proven): no split along the {', '.join(candidates)} order(s) fits {devices} × {target.name} under the "
                f"learned corrections {', '.join(f'{x:.3g}' for x in scale)} at margin {safety_margin:g} "
                "(the order search is not exhaustive over DAG splits, so this is no proof for the model alone)",
                hint=f"rerun with --devices {devices + 1}",
                reruns=({"devices": devices + 1},),
                device=int(np.argmax(scale)),
            )
        partition, oc = _least_overfull(first_oc, caps, require_costed)
        plan = plan_of(oc, next(iter(candidates)), partition)
        timings["total"] = time.perf_counter() - t0
        return replace(
            plan,
            orders_tried=tried,
            timings_s=timings,
            probes=partition.probes,
            method="overfull",
            claim=f"no split found within the estimate and none proven impossible; {searched}",
        )
    partition, oc, name = best
    t1 = time.perf_counter()
    balanced = balance_order(oc, caps, partition, require_costed=require_costed)
    timings["balance"] = time.perf_counter() - t1
    if balanced is not None and balanced.bottleneck_s <= partition.bottleneck_s * (1 + 1e-9):
        partition = balanced
    plan = plan_of(oc, name, partition)
    timings["total"] = time.perf_counter() - t0
    meets = _meets(partition.bottleneck_s, bound)
    return replace(
        plan,
        orders_tried=tried,
        timings_s=timings,
        probes=partition.probes,
        method="orders",
        proven_optimal=meets or found.proven,
        claim=(
            "meets the lower bound: no valid split is faster"
            if meets
            else f"exact on each candidate order ({', '.join(tried)}); {searched}"
        )
        + order_balance_claim(name, partition.balanced),
    )


def _plan_corrected(
    analysis: Analysis,
    target: Target,
    devices: int,
    *,
    safety_margin: float,
    memory_scale: Sequence[float] | np.ndarray | None,
    orders: Sequence[str] | None,
    measured_s: np.ndarray | None,
    content: ContentCorrection,
) -> Plan:
    """Plan on the corrected sizes, then cost the chosen split on the original model.

    The corrected analysis grows cut tensors too, so its times are not the model's: the split is
    kept and re-costed (times, bytes), and each stage's memory scale becomes the effective one
    (corrected / original bytes × the device's own scale), so ``budget_bytes`` still reads against
    the original bytes."""
    scale = np.ones(devices) if memory_scale is None else np.asarray(memory_scale, dtype=np.float64)
    corrected = corrected_analysis(analysis, content, target.memory_bytes)
    note = f" (with memory corrections learned from compiles: {content.describe()})"
    try:
        searched = _search(
            corrected,
            target,
            devices,
            safety_margin=safety_margin,
            memory_scale=scale,
            orders=orders,
            measured_s=measured_s,
        )
    except NoSplitError as err:
        err.message += note
        raise
    compute_s = calibrated_compute_s(analysis, target, measured_s)
    oc = ordered_costs(analysis, target, searched.order, compute_s)
    bounds = searched.bounds
    pairs = list(itertools.pairwise(bounds))
    original = np.array([max(sum(oc.stage_memory(a, b)), 1) for a, b in pairs], dtype=np.float64)
    grown = np.array([stage.memory_bytes for stage in searched.stages], dtype=np.float64)
    effective = scale * np.maximum(grown / original, 1e-6)
    partition = Partition(
        bounds=bounds,
        bottleneck_s=max(oc.stage_time(a, b) for a, b in pairs),
        probes=searched.probes,
    )
    caps = target.memory_bytes / (safety_margin * effective)
    bound = lower_bound_all_splits(analysis, target, compute_s, devices)
    overhead = node_overhead_s(analysis, target) if measured_s is None else None
    plan = build_plan(
        analysis,
        oc,
        searched.order_name,
        partition,
        target,
        caps,
        safety_margin,
        effective,
        bound=bound,
        overhead_s=overhead,
    )
    return replace(
        plan,
        orders_tried=searched.orders_tried,
        timings_s=searched.timings_s,
        method=searched.method,
        proven_optimal=False,
        claim=f"{searched.claim}; searched on the sizes corrected by compiles ({content.describe()}), "
        "cut traffic costed at those sizes while searching",
    )


def _meets(bottleneck_s: float, bound: float) -> bool:
    """At the lower bound (up to rounding): no valid split is faster."""
    return bool(bottleneck_s <= bound * (1 + 1e-9))


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
