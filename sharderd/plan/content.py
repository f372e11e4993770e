"""Memory corrections that follow a stage's nodes, not its device index (every IPU is alike; a
big matmul's partials overflow wherever they land): factors on nodes (``ContentCorrection``),
applied to the bytes they bring to any stage (``corrected_analysis``), so the planner plans with
the corrected sizes, every order, DP and proof unchanged."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.observations import Runs, runs_size

__all__ = ["ContentCorrection", "corrected_analysis", "node_factors"]


@dataclass(frozen=True, slots=True)
class ContentCorrection:
    """Per-node memory factors: ``base`` everywhere; each of ``measured`` (a stage a compile fitted
    and measured, or the nodes between two nested overflows) sets its nodes' factor, in order;
    then each of ``patches`` (stages that ran out of memory) raises its nodes to at least its
    factor, so every overflow stays reproduced."""

    base: float = 1.0
    patches: tuple[tuple[Runs, float], ...] = ()
    measured: tuple[tuple[Runs, float], ...] = ()
    fixed: tuple[tuple[Runs, float], ...] = ()
    """A cost (share of a device) that comes with these nodes whatever else the stage holds, as
    one op's code or exchange does: planned as one extra weight all of them read, so a stage
    holding any of them pays it once."""
    fixed_on_heaviest: bool = False
    """Each fixed cost goes with the heaviest of its nodes only: the compiles say it is in one of
    them, not which, and a verdict takes the reading most in the model's favour."""

    @property
    def identity(self) -> bool:
        return self.base == 1.0 and not self.patches and not self.measured and not self.fixed

    def describe(self) -> str:
        if self.identity:
            return "none"
        factors = [f for _, f in self.patches] or [self.base]
        nodes = sum(runs_size(runs) for runs, _ in self.patches)
        return (
            f"×{min(factors):.3g}–{max(factors):.3g} on the {nodes} node(s) of "
            f"{len(self.patches)} overflowed stage(s), {len(self.measured)} set(s) priced between "
            f"nested overflows, {len(self.fixed)} fixed cost(s)"
        )


def node_factors(correction: ContentCorrection, num_nodes: int) -> np.ndarray:
    """float64 [N]: the factor on each node's bytes."""
    factors = np.full(num_nodes, correction.base, dtype=np.float64)
    for runs, factor in correction.measured:
        for start, stop in runs:
            factors[start : min(stop, num_nodes)] = factor
    for runs, factor in correction.patches:
        for start, stop in runs:
            hi = min(stop, num_nodes)
            if start < hi:
                np.maximum(factors[start:hi], factor, out=factors[start:hi])
    return factors


def corrected_analysis(
    analysis: Analysis, correction: ContentCorrection, capacity: int
) -> Analysis:
    """The analysis with every tensor and weight grown by the largest factor among the nodes that
    touch it (code is a per-node constant: not scaled), plus one weight per fixed cost read by its
    nodes. Times derived from cut bytes grow too: the planner costs the final plan on the original."""
    flow, costs = analysis.flow, analysis.costs
    factors = node_factors(correction, flow.num_nodes)
    t_factor = np.full(flow.num_tensors, -np.inf)
    has = flow.producer >= 0
    t_factor[has] = factors[flow.producer[has]]
    if len(flow.cons_idx):
        of_tensor = np.repeat(np.arange(flow.num_tensors), np.diff(flow.cons_ptr))
        np.maximum.at(t_factor, of_tensor, factors[flow.cons_idx])
    w_factor = np.full(len(flow.weight_bytes), -np.inf)
    of_node = np.repeat(np.arange(flow.num_nodes), np.diff(flow.nw_ptr))
    if len(flow.nw_idx):
        np.maximum.at(w_factor, flow.nw_idx, factors[of_node])
    t_factor[~np.isfinite(t_factor)] = 1.0  # touched by no node: nothing plans with it
    w_factor[~np.isfinite(w_factor)] = 1.0
    tensor_bytes = np.ceil(costs.tensor_bytes * t_factor).astype(costs.tensor_bytes.dtype)
    weight_bytes = np.ceil(flow.weight_bytes * w_factor).astype(flow.weight_bytes.dtype)
    nw_idx, nw_ptr = flow.nw_idx, flow.nw_ptr
    names, types = flow.weight_names, flow.weight_types
    if correction.fixed:
        names = (*names, *(f"<fixed cost {k}>" for k in range(len(correction.fixed))))
        types = np.concatenate([types, np.ones(len(correction.fixed), dtype=types.dtype)])
        extra = np.array([int(np.ceil(share * capacity)) for _, share in correction.fixed])
        first = len(weight_bytes)
        weight_bytes = np.concatenate([weight_bytes, extra.astype(weight_bytes.dtype)])
        nodes, ids = [of_node], [nw_idx]
        heavy = _node_bytes(analysis) if correction.fixed_on_heaviest else None
        for k, (runs, _) in enumerate(correction.fixed):
            held = np.concatenate(
                [np.arange(a, min(b, flow.num_nodes)) for a, b in runs] or [np.zeros(0, int)]
            )
            if heavy is not None and len(held):
                held = held[np.argmax(heavy[held])][None]
            nodes.append(held)
            ids.append(np.full(len(held), first + k, dtype=nw_idx.dtype))
        node_of = np.concatenate(nodes)
        order = np.argsort(node_of, kind="stable")
        nw_idx = np.concatenate(ids)[order]
        nw_ptr = np.zeros(flow.num_nodes + 1, dtype=nw_ptr.dtype)
        np.cumsum(np.bincount(node_of, minlength=flow.num_nodes), out=nw_ptr[1:])
    return replace(
        analysis,
        flow=replace(
            flow,
            weight_names=names,
            weight_types=types,
            weight_bytes=weight_bytes,
            nw_idx=nw_idx,
            nw_ptr=nw_ptr,
        ),
        costs=replace(costs, tensor_bytes=tensor_bytes),
    )


def _node_bytes(analysis: Analysis) -> np.ndarray:
    """float64 [N]: each node's weights and outputs (what makes one op of a stage the heavy one)."""
    flow = analysis.flow
    out = np.zeros(flow.num_nodes)
    of_out = np.repeat(np.arange(flow.num_nodes), np.diff(flow.out_ptr))
    np.add.at(out, of_out, analysis.costs.tensor_bytes[flow.out_idx])
    of_w = np.repeat(np.arange(flow.num_nodes), np.diff(flow.nw_ptr))
    np.add.at(out, of_w, flow.weight_bytes[flow.nw_idx])
    return out
