"""Proofs that no split fits, as ``PlanInfeasibleError`` with the numbers a user acts on.

A "does not fit" must be true: each error here rests on a fact that rules out every split (one node
too large for any device, the distinct weights over the devices' total, every ideal checked), and
names how many devices would do where some number would.
"""

from __future__ import annotations

import numpy as np

from sharderd.errors import PlanInfeasibleError
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.plan.ideals import solve_ideals
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["activation_bytes", "infeasible_exact", "infeasible_proof", "node_too_large"]


def node_too_large(
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
    error = PlanInfeasibleError(
        f"node {node!r} alone needs {fmt_bytes(need)} (its weights, inputs, outputs and code, "
        f"× margin {margin:g}{learned}) but one {target.name} device holds {fmt_bytes(capacity)}: "
        "no number of pipeline stages can fit it",
        hint="reduce batch_size or the op's size, or use a target with more memory",
        device=None,
        short_bytes=int(need - capacity),
        min_devices=None,
    )
    error.node = node
    error.node_need = need / capacity
    error.node_activation_share = activation_bytes(analysis, worst) / max(
        float(floor.node_bytes[worst]), 1.0
    )
    return error


def activation_bytes(analysis: Analysis, node: int) -> float:
    """Bytes of a node's activation inputs and outputs (its weights and code aside)."""
    flow, tb = analysis.flow, analysis.costs.tensor_bytes
    ins = flow.in_idx[flow.in_ptr[node] : flow.in_ptr[node + 1]]
    outs = flow.out_idx[flow.out_ptr[node] : flow.out_ptr[node + 1]]
    return float(tb[ins].sum() + tb[outs].sum())


def infeasible_proof(
    analysis: Analysis, target: Target, devices: int, margin: float, scale: np.ndarray
) -> PlanInfeasibleError | None:
    """Facts that rule out every split without searching them, or None (the search was not a proof)."""
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


def infeasible_exact(
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
