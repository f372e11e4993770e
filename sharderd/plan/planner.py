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
from sharderd.plan.bounds import lower_bound_all_splits
from sharderd.plan.build import build_plan
from sharderd.plan.contract import Groups, contract
from sharderd.plan.group_ideals import solve_groups
from sharderd.plan.ideals import IdealSplit, solve_ideals
from sharderd.plan.infeasible import infeasible_exact, infeasible_proof
from sharderd.plan.neighbourhood import Neighbourhood, search_near
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import OrderedCosts, calibrated_compute_s, ordered_costs
from sharderd.plan.partition import Partition, solve
from sharderd.plan.types import Plan
from sharderd.target import Target

__all__ = ["DP_GAIN", "LEVEL_ORDER_GAIN", "lower_bound", "plan_stages"]

_NO_GROUPS = Groups(np.zeros(0, dtype=np.int64), 0, (), ())
"""Stands in when the DPs are skipped (the order plan is within ``DP_GAIN`` of the bound)."""

LEVEL_ORDER_GAIN = 0.01
"""The level order replaces the file/depth-first plan only when it is this much faster: it exists
for splits across parallel branches (often 10%+), and a hair's gain is not worth a stage boundary
inside a block instead of at a layer's end."""
DP_GAIN = LEVEL_ORDER_GAIN
"""Likewise for a split found by the DP over a graph the order search planned (the DP's split is
kept when no order has one): a cut of any shape for a hair's gain is not worth it."""


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
            raise infeasible_exact(
                analysis, target, compute_s, reference, devices, safety_margin, scale, exact.ideals
            )
        plan = _plan_of_split(
            analysis,
            target,
            compute_s,
            reference,
            exact.assignment,
            caps,
            safety_margin,
            scale,
            bound=bound,
            overhead=overhead,
            method="ideals",
        )
        timings["total"] = time.perf_counter() - t0
        return replace(
            plan,
            timings_s=timings,
            proven_optimal=True,
            claim=f"optimal over every valid split (DP over all {exact.ideals} ideals)",
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
    # Learned corrections are per device, while an excess follows the content (one big op): a DP
    # that moves work onto a device with a smaller factor finds splits the next compile refutes,
    # so under corrections the compile search keeps its own retries (docs/search.md).
    corrected = memory_scale is not None
    skip = met or proof is not None or corrected
    t1 = time.perf_counter()
    groups = _NO_GROUPS if skip else contract(analysis)
    grouped = (
        None
        if skip
        else solve_groups(
            analysis,
            target,
            compute_s,
            reference,
            caps,
            groups,
            require_costed=require_costed,
            upper_bound=upper,
        )
    )
    if not skip:
        timings["solve.contracted"] = time.perf_counter() - t1
    if (
        grouped is not None
        and grouped.assignment is not None
        and grouped.bottleneck_s < upper * (1 - DP_GAIN)
    ):
        plan = _plan_of_split(
            analysis,
            target,
            compute_s,
            reference,
            grouped.assignment,
            caps,
            safety_margin,
            scale,
            bound=bound,
            overhead=overhead,
            method="contracted" if groups.merged else "ideals",
        )
        tried[plan.method] = plan.bottleneck_s
        timings["total"] = time.perf_counter() - t0
        meets = bool(plan.bottleneck_s <= bound * (1 + 1e-9))
        return replace(
            plan,
            orders_tried=tried,
            timings_s=timings,
            proven_optimal=meets or groups.merged == 0,
            claim=_contracted_claim(grouped.ideals, groups, meets),
        )
    near = None
    if grouped is None and best is not None and not skip:
        t1 = time.perf_counter()
        near = search_near(
            analysis,
            target,
            compute_s,
            reference,
            caps,
            groups,
            best[1].order,
            best[0].bounds,
            require_costed=require_costed,
            upper_bound=upper,
        )
        timings["solve.neighbourhood"] = time.perf_counter() - t1
        if (
            near is not None
            and near.assignment is not None
            and near.bottleneck_s < upper * (1 - DP_GAIN)
        ):
            plan = _plan_of_split(
                analysis,
                target,
                compute_s,
                reference,
                near.assignment,
                caps,
                safety_margin,
                scale,
                bound=bound,
                overhead=overhead,
                method="neighbourhood",
            )
            tried[plan.method] = plan.bottleneck_s
            timings["total"] = time.perf_counter() - t0
            meets = bool(plan.bottleneck_s <= bound * (1 + 1e-9))
            return replace(
                plan,
                orders_tried=tried,
                timings_s=timings,
                proven_optimal=meets,
                claim=_near_claim(near, best[2], groups)
                + ("; it meets the lower bound, so no valid split is faster" if meets else ""),
            )
    searched = (
        f"it is within {upper / bound - 1:.2%} of the lower bound, so no valid split is "
        f"{DP_GAIN:.0%} faster"
        if met
        else "the DPs over the whole graph are not run under learned corrections"
        if corrected
        else _searched(grouped, groups, upper, near)
    )
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
            raise PlanInfeasibleError(
                f"no split along the {', '.join(candidates)} order(s) fits {devices} × {target.name} under the "
                f"learned corrections {', '.join(f'{x:.3g}' for x in scale)} at margin {safety_margin:g} "
                "(the order search is not exhaustive over DAG splits, so this is no proof for the model alone)",
                hint="the compile search retries its least overfull split; more devices leave room",
                device=int(np.argmax(scale)),
            )
        partition, oc = _least_overfull(first_oc, caps, require_costed)
        plan = build_plan(
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
            plan,
            orders_tried=tried,
            timings_s=timings,
            probes=partition.probes,
            method="overfull",
            claim=f"no split found within the estimate and none proven impossible; {searched}",
        )
    partition, oc, name = best
    plan = build_plan(
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
    meets = bool(partition.bottleneck_s <= bound * (1 + 1e-9))
    exhaustive = (
        grouped is not None
        and not groups.merged
        and (grouped.assignment is None or grouped.bottleneck_s >= upper * (1 - 1e-9))
    )
    return replace(
        plan,
        orders_tried=tried,
        timings_s=timings,
        probes=partition.probes,
        method="orders",
        proven_optimal=meets or exhaustive,
        claim=(
            "meets the lower bound: no valid split is faster"
            if meets
            else f"exact on each candidate order ({', '.join(tried)}); {searched}"
        ),
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


def _plan_of_split(
    analysis: Analysis,
    target: Target,
    compute_s: np.ndarray,
    reference: np.ndarray,
    assignment: np.ndarray,
    caps: np.ndarray,
    safety_margin: float,
    scale: np.ndarray,
    *,
    bound: float,
    overhead: float,
    method: str,
) -> Plan:
    """A plan from a stage per node, costed on the split's canonical order."""
    devices = len(caps)
    order = _canonical_order(assignment, reference)
    oc = ordered_costs(analysis, target, order, compute_s)
    bounds = (0, *np.cumsum(np.bincount(assignment, minlength=devices)).tolist())
    partition = Partition(
        bounds=tuple(int(b) for b in bounds),
        bottleneck_s=max(oc.stage_time(a, b) for a, b in itertools.pairwise(bounds)),
        probes=0,
    )
    plan = build_plan(
        analysis,
        oc,
        method,
        partition,
        target,
        caps,
        safety_margin,
        scale,
        bound=bound,
        overhead_per_node=overhead,
    )
    return replace(plan, method=method, orders_tried={method: partition.bottleneck_s})


def _contracted_claim(ideals: int, groups: Groups, meets: bool) -> str:
    if groups.merged == 0:
        return f"optimal over every valid split (DP over all {ideals} ideals)"
    kept = (
        f"optimal over the splits that keep shape arithmetic and constant-only nodes with their "
        f"neighbours ({len(groups.of_node)} nodes in {groups.count} groups; DP over {ideals} ideals)"
    )
    return kept + ("; it meets the lower bound, so no valid split is faster" if meets else "")


def _near_claim(near: Neighbourhood, start: str, groups: Groups) -> str:
    rounds = f"{near.rounds} round{'s' if near.rounds > 1 else ''}"
    kept = ", keeping the contracted groups together" if groups.merged else ""
    return (
        f"optimal over the splits whose every cut lies within {_nodes(near.window)} of the "
        f"previous plan's cuts{kept} ({rounds} from the `{start}` order's plan; DP over "
        f"{near.ideals} ideals); not proven over every split: the DP over the whole graph was "
        "past its limits"
    )


def _searched(
    grouped: IdealSplit | None, groups: Groups, upper: float, near: Neighbourhood | None = None
) -> str:
    """What the DPs showed when the order search's plan stands."""
    if grouped is None:
        if near is not None:
            return (
                f"the DP over the contracted graph ({groups.count} groups) was past its limits; "
                f"none of the splits whose cuts lie within {_nodes(near.window)} of this plan's cuts "
                f"is {DP_GAIN:.0%} faster (DP over {near.ideals} ideals)"
            )
        return (
            f"the DP over the contracted graph ({groups.count} groups) was past its limits, "
            "so splits outside those orders were not searched"
        )
    over = (
        f"every valid split (DP over all {grouped.ideals} ideals)"
        if not groups.merged
        else f"the splits that keep the {groups.count} groups of the contracted graph together "
        f"(DP over its {grouped.ideals} ideals)"
    )
    if grouped.assignment is not None and grouped.bottleneck_s < upper * (1 - 1e-9):
        gain = 1 - grouped.bottleneck_s / upper
        return (
            f"the best of {over} is {gain:.2%} faster, under the {DP_GAIN:.0%} worth a stage "
            "boundary away from the order's layer ends, so the order's split is kept"
        )
    return f"none of {over} is faster"


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"
