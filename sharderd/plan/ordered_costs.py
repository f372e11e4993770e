"""Costs laid out along one topological order, ready for interval queries.

For the cut ``c`` between positions ``c-1`` and ``c``, ``cut_bytes[c]`` is every tensor produced
before ``c`` and read at or after ``c``. In a PopART pipeline such a tensor is copied across that
cut (copies to a later stage are chained through the stages in between), so the stage on each side
pays for it: the sender's and receiver's exchange time, and live memory on every stage it passes.
A graph input is streamed from the host to the stage of its first reader and copied on from there,
as the annotation routes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.op_costs import node_code_bytes, node_overhead_s
from sharderd.target import Target

__all__ = ["OrderedCosts", "calibrated_compute_s", "ordered_costs"]


@dataclass(frozen=True, slots=True)
class OrderedCosts:
    order: np.ndarray
    """int64 [n]: node at each position."""
    node_time: np.ndarray
    """float64 [n]: compute + per-op overhead + host I/O of the node at each position, seconds."""
    prefix_time: np.ndarray
    """float64 [n+1]: cumulative ``node_time``."""
    cut_bytes: np.ndarray
    """int64 [n+1]: bytes crossing each cut; 0 at both ends."""
    live_bytes: np.ndarray
    """int64 [n]: bytes live while the node at each position runs: its inputs, and its outputs
    unless they take over an input's memory (``graph/buffers.py``)."""
    flops: np.ndarray
    """float64 [n]."""
    costed: np.ndarray
    """bool [n]: the node has FLOPs or weights (a stage of only free nodes is no work)."""
    w_ptr: np.ndarray
    w_idx: np.ndarray
    """CSR over positions: weight ids each node needs."""
    weight_bytes: np.ndarray
    code_prefix: np.ndarray
    """int64 [n+1]: cumulative code bytes of the nodes along the order (folded nodes add none)."""
    link_bytes_per_s: float
    producer_pos: np.ndarray
    """int64 [T]: position where each tensor appears (first reader for graph inputs; -1 unused)."""
    last_pos: np.ndarray
    """int64 [T]: last position that reads it (== producer_pos when nobody does)."""
    host_time: np.ndarray | None = None
    """float64 [n]: the host I/O part of ``node_time`` (graph inputs streamed in, outputs sent out)."""

    @property
    def n(self) -> int:
        return len(self.order)

    def stage_time(self, i: int, j: int) -> float:
        return float(
            self.prefix_time[j]
            - self.prefix_time[i]
            + (self.cut_bytes[i] + self.cut_bytes[j]) / self.link_bytes_per_s
        )

    def stage_weights(self, i: int, j: int) -> int:
        ids = np.unique(self.w_idx[self.w_ptr[i] : self.w_ptr[j]])
        return int(self.weight_bytes[ids].sum())

    def stage_memory(self, i: int, j: int) -> tuple[int, int, int]:
        """(weights, peak live activations, code) of positions [i, j)."""
        return (
            self.stage_weights(i, j),
            int(self.live_bytes[i:j].max()) if j > i else 0,
            int(self.code_prefix[j] - self.code_prefix[i]),
        )


def calibrated_compute_s(
    analysis: Analysis, target: Target, measured_s: np.ndarray | None
) -> np.ndarray:
    """Per-node compute seconds: the FLOP model plus each compiled node's overhead (a folded node
    costs nothing), or measured times where a profile has them.

    Nodes a profile misses (fused away, too fast to record) get the analytic time scaled by the
    median measured/analytic ratio, so the two sources stay on one scale.
    """
    analytic = analysis.costs.flops / target.effective_flops_per_s + node_overhead_s(
        analysis, target
    )
    if measured_s is None:
        return analytic
    known = np.isfinite(measured_s) & (measured_s >= 0)
    both = known & (analysis.costs.flops > 0)
    scale = float(np.median(measured_s[both] / analytic[both])) if both.any() else 1.0
    return np.where(known, measured_s, analytic * scale)


def ordered_costs(
    analysis: Analysis, target: Target, order: np.ndarray, compute_s: np.ndarray | None = None
) -> OrderedCosts:
    flow, costs = analysis.flow, analysis.costs
    n = flow.num_nodes
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n, dtype=np.int64)

    num_t = flow.num_tensors
    counts = np.diff(flow.cons_ptr)
    has_readers = counts > 0
    reader_pos = pos[flow.cons_idx] if len(flow.cons_idx) else np.zeros(0, dtype=np.int64)
    first = np.full(num_t, -1, dtype=np.int64)
    last = np.full(num_t, -1, dtype=np.int64)
    if has_readers.any():
        starts = flow.cons_ptr[:-1][has_readers]
        first[has_readers] = np.minimum.reduceat(reader_pos, starts)
        last[has_readers] = np.maximum.reduceat(reader_pos, starts)

    is_input = flow.producer < 0
    produced_at = np.where(is_input, first, pos[np.maximum(flow.producer, 0)])
    last = np.where(has_readers, last, produced_at)
    tbytes = costs.tensor_bytes

    crossing = (produced_at >= 0) & (last > produced_at)
    diff = np.zeros(n + 2, dtype=np.int64)
    np.add.at(diff, produced_at[crossing] + 1, tbytes[crossing])
    np.add.at(diff, last[crossing] + 1, -tbytes[crossing])
    cut = np.cumsum(diff)[: n + 1]

    out_bytes = analysis.node_new_bytes()[order]  # a view or in-place output adds none
    host_in = np.zeros(n, dtype=np.int64)
    streamed = is_input & has_readers
    np.add.at(host_in, first[streamed], tbytes[streamed])
    host_out = np.zeros(n, dtype=np.int64)
    outs = flow.is_graph_output & ~is_input
    np.add.at(host_out, produced_at[outs], tbytes[outs])

    live = cut[:n] + out_bytes + host_in
    flops = costs.flops[order]
    per_node = calibrated_compute_s(analysis, target, None) if compute_s is None else compute_s
    host_time = (host_in + host_out) / target.host_bytes_per_s
    node_time = per_node[order] + host_time
    prefix = np.zeros(n + 1, dtype=np.float64)
    np.cumsum(node_time, out=prefix[1:])

    w_counts = np.diff(flow.nw_ptr)[order]
    w_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(w_counts, out=w_ptr[1:])
    if len(flow.nw_idx):
        starts = flow.nw_ptr[order]
        gather = np.repeat(starts - w_ptr[:-1], w_counts) + np.arange(int(w_ptr[-1]))
        w_idx = flow.nw_idx[gather]
    else:
        w_idx = np.zeros(0, dtype=np.int64)
    has_weights = w_counts > 0
    costed = (flops > 0) | has_weights
    code_prefix = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(node_code_bytes(analysis, target)[order], out=code_prefix[1:])
    return OrderedCosts(
        order=order,
        node_time=node_time,
        prefix_time=prefix,
        cut_bytes=cut,
        live_bytes=live,
        flops=flops,
        costed=costed,
        w_ptr=w_ptr,
        w_idx=w_idx,
        weight_bytes=flow.weight_bytes,
        code_prefix=code_prefix,
        link_bytes_per_s=target.link_bytes_per_s,
        producer_pos=produced_at,
        last_pos=last,
        host_time=host_time,
    )
