"""Why no split was found: a proof (``PlanInfeasibleError``, exit 3) or an estimate (``NotProvenError``,
exit 5), with the numbers a user acts on.

A proof rests only on facts true of the real compiler (``errors.GROUNDS``): here, the weights
alone, with no margin and no per-node estimate (``weights_proof``). Everything else the planner
concludes from its estimates (inputs, outputs, per-op code, the safety margin, learned
corrections) rules splits out of the *estimate* only, and says so.
"""

from __future__ import annotations

import math

import numpy as np

from sharderd.errors import NotProvenError, PlanInfeasibleError
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.plan.ideals import solve_ideals
from sharderd.plan.types import Plan
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = [
    "activation_bytes",
    "fitting_hint",
    "infeasible_exact",
    "infeasible_proof",
    "overfull_not_proven",
    "weights_proof",
    "with_fitting_hint",
]


def weights_proof(analysis: Analysis, target: Target, devices: int) -> PlanInfeasibleError | None:
    """One node's weights alone over a device, or the distinct weights over all devices together.

    ``node_weights``: an op's inputs are whole on its device while it runs (Poplar places a
    tensor on one IPU's tiles; one made elsewhere is copied there whole), so one node's weights,
    folded constants included, must fit one device at once whatever the split, and whether or not
    the compiler folds them. ``weights_total``: a weight the file stores stays on a device for the
    whole program, so the distinct stored weights must fit all devices at once; a folded constant
    is left out there (not folded, the compiler computes it at run time, and it need not be held at
    the same time as the rest). Nothing else (activations, code, the margin) is counted.
    """
    flow, capacity = analysis.flow, target.memory_bytes
    per_node = np.zeros(flow.num_nodes)
    ws_of = np.repeat(np.arange(flow.num_nodes), np.diff(flow.nw_ptr))
    np.add.at(per_node, ws_of, flow.weight_bytes[flow.nw_idx].astype(np.float64))
    worst = int(np.argmax(per_node)) if len(per_node) else 0
    if len(per_node) and per_node[worst] > capacity:
        node = flow.node_names[worst]
        weights, device = _sizes(per_node[worst], capacity)
        return PlanInfeasibleError(
            f"the model does not fit on any number of {target.name} devices: node {node!r}'s weights "
            f"alone are {weights}, more than one device's {device}",
            grounds="node_weights",
            hint="use a smaller model, a lower precision, or a target with more memory",
            short_bytes=int(per_node[worst] - capacity),
            node=node,
        )
    total = float(analysis.total_weight_bytes - analysis.folded_bytes)
    if total <= capacity * devices:
        return None
    needed = max(devices + 1, math.ceil(total / capacity))
    weights, together = _sizes(total, capacity * devices)
    return PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: its distinct weights alone are "
        f"{weights}{' (the constants it folds left out)' if analysis.folded_bytes else ''}, more than the {devices} devices' {together} together. "
        f"At least {needed} devices are needed to hold them.",
        grounds="weights_total",
        hint=f"rerun with --devices {needed} (a lower bound: activations and code need room too)",
        reruns=({"devices": needed},),
        short_bytes=int(total - capacity * devices),
        min_devices=needed,
    )


def _sizes(more: float, less: float) -> tuple[str, str]:
    """Two sizes, the first over the second, as a message prints them: rounded, or in bytes where
    the rounded figures would read the same."""
    a, b = fmt_bytes(more), fmt_bytes(less)
    return (a, b) if a != b else (f"{int(more):,} B", f"{int(less):,} B")


def node_too_large(
    analysis: Analysis, target: Target, margin: float, typical: float
) -> NotProvenError | None:
    """A node the estimate says cannot fit even alone (its weights, inputs, outputs not computed in
    place, code, × margin)."""
    floor = memory_floor(analysis, target)
    capacity = target.memory_bytes
    worst = int(np.argmax(floor.node_bytes))
    need = float(floor.node_bytes[worst]) * margin * typical
    if need <= capacity:
        return None
    node = analysis.flow.node_names[worst]
    learned = f" × correction {typical:.3g}" if typical != 1.0 else ""
    error = NotProvenError(
        f"no fitting split found (not proven): node {node!r} alone is estimated at {fmt_bytes(need)} "
        f"(its weights, inputs, outputs not computed in place, and code, × margin {margin:g}{learned}) "
        f"but one {target.name} device holds {fmt_bytes(capacity)}; an estimate, not a proof",
        hint="`sharderd shard` with a compile backend measures it (its probe compiles the node alone); "
        "or reduce batch_size",
        reruns=({"backend": "poprt"},),
        short_bytes=int(need - capacity),
    )
    error.node = node
    error.node_need = need / capacity
    error.node_activation_share = activation_bytes(analysis, worst) / max(
        float(floor.node_bytes[worst]), 1.0
    )
    return error


def activation_bytes(analysis: Analysis, node: int) -> float:
    """Bytes of a node's activation inputs and of the outputs that take new memory (an in-place
    Softmax counts its one buffer once; weights and code aside)."""
    flow, tb = analysis.flow, analysis.costs.tensor_bytes
    ins = flow.in_idx[flow.in_ptr[node] : flow.in_ptr[node + 1]]
    return float(tb[ins].sum() + analysis.node_new_bytes()[node])


def infeasible_proof(
    analysis: Analysis, target: Target, devices: int, margin: float, scale: np.ndarray
) -> NotProvenError | None:
    """Estimates that rule out every split of the *estimate* without searching them, or None."""
    typical = float(np.median(scale))
    too_large = node_too_large(analysis, target, margin, typical)
    if too_large is not None:
        return too_large
    floor = memory_floor(analysis, target)
    caps = target.memory_bytes / (margin * scale)
    if floor.total_bytes <= caps.sum():
        return None
    needed = floor.min_devices(target.memory_bytes / (margin * typical))
    short = int((floor.total_bytes - caps.sum()) * margin * typical)
    return NotProvenError(
        f"no fitting split found on {devices} × {target.name} (not proven): its distinct weights and "
        f"estimated per-op code (by op type) need {fmt_bytes(floor.total_bytes * margin)} (× margin {margin:g}), "
        f"more than the {devices} devices' {fmt_bytes(caps.sum() * margin)} together; the estimate "
        f"suggests {needed} devices.",
        hint=f"rerun with --devices {max(needed, devices + 1)}",
        reruns=({"devices": max(needed, devices + 1)},),
        short_bytes=short,
        min_devices=max(needed, devices + 1),
    )


def infeasible_exact(
    analysis: Analysis,
    target: Target,
    compute_s: np.ndarray,
    reference: np.ndarray,
    devices: int,
    margin: float,
    scale: np.ndarray,
    ideals: int,
) -> NotProvenError:
    """Every valid split of the estimate was checked and none fits: say so, and how many devices do."""
    typical = float(np.median(scale))
    too_large = node_too_large(analysis, target, margin, typical)
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
    learned = (
        f" with the learned corrections {', '.join(f'{x:.3g}' for x in scale)}"
        if (scale != 1.0).any()
        else ""
    )
    error = NotProvenError(
        f"no fitting split found on {devices} × {target.name} (not proven): none of the valid splits "
        f"(every split over its {ideals} ideals was checked) fits the estimated memory at margin "
        f"{margin:g}{learned}" + (f"; the estimate suggests {needed} devices." if needed else "."),
        hint=f"rerun with --devices {needed}" if needed is not None else None,
        reruns=() if needed is None else ({"devices": needed},),
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


def overfull_not_proven(
    plan: Plan, target: Target, fits_on: int | None, searched_to: int
) -> NotProvenError:
    """A plan no compile will check that the estimate says overflows (``method == "overfull"``);
    ``fits_on`` is the fewest devices up to ``searched_to`` on which the planner found a split that
    fits (``fewest.first_fitting``), None when none did."""
    worst = max(plan.stages, key=lambda s: s.memory_bytes / max(s.budget_bytes, 1))
    hint, reruns = fitting_hint(plan.devices, fits_on, searched_to)
    return NotProvenError(
        f"no fitting split found on {plan.devices} × {target.name} (not proven): the least overfull "
        f"split the order search found puts {fmt_bytes(worst.memory_bytes)} on device {worst.index}, "
        f"over its budget of {fmt_bytes(worst.budget_bytes)} (margin {plan.safety_margin:g}); no "
        "estimate rules every split out, and no compile was asked for",
        hint=hint,
        reruns=reruns,
        device=worst.index,
        short_bytes=int(worst.memory_bytes - worst.budget_bytes),
        min_devices=fits_on,
    )


def with_fitting_hint(
    err: NotProvenError, devices: int, fits_on: int | None, searched_to: int
) -> NotProvenError:
    """``err`` (no split found on ``devices``) with its hint and ``min_devices`` naming the count
    the planner found a fitting split on, instead of the estimate's guess."""
    hint, reruns = fitting_hint(devices, fits_on, searched_to)
    again = NotProvenError(
        err.message,
        hint=hint,
        reruns=reruns,
        device=err.device,
        short_bytes=err.short_bytes,
        min_devices=fits_on,
        fits_without_margin=err.fits_without_margin,
    )
    again.node, again.node_need, again.node_activation_share = (
        err.node,
        err.node_need,
        err.node_activation_share,
    )
    return again


def fitting_hint(
    devices: int, fits_on: int | None, searched_to: int
) -> tuple[str, tuple[dict[str, object], ...]]:
    """The rerun after no split fitted on ``devices``: the count a fitting split was found on, or,
    when none up to ``searched_to`` was, more devices than that; a compile backend either way."""
    compile_too = "`sharderd shard` with a compile backend to let the compiler decide"
    if fits_on is None:
        return (
            f"no split fits the estimate on {devices + 1} to {searched_to} devices either: rerun "
            f"with more than {searched_to}, or {compile_too}",
            ({"devices": searched_to + 1}, {"backend": "poprt"}),
        )
    return (
        f"rerun with --devices {fits_on} (the fewest on which the planner found a split that "
        f"fits), or {compile_too}",
        ({"devices": fits_on}, {"backend": "poprt"}),
    )
