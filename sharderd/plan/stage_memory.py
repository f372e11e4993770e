"""The memory of one stage of a general split, as the canonical order counts it, in O(N + E).

Stage ``S`` runs after the nodes ``B`` of the earlier stages, its own nodes in the reference order
(docs/planning.md, "Cost model"). While node ``q`` of ``S`` runs, the live tensors are those made
before ``q`` (in ``B`` or earlier in ``S``, a graph input from its first reader on) that some node
at or after ``q`` still reads, plus ``q``'s outputs: exactly ``OrderedCosts.live_bytes`` of that
order, without building the order. The DP over a large lattice asks this for the few stages its
cheap bounds cannot settle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.op_costs import node_code_bytes
from sharderd.target import Target

__all__ = ["StageMemory"]


@dataclass(frozen=True, slots=True)
class StageMemory:
    rank: np.ndarray
    """int64 [N]: position of each node in the reference order."""
    producer: np.ndarray
    cons_idx: np.ndarray
    read_starts: np.ndarray
    """int64: first entry of each tensor that has readers."""
    read_tensors: np.ndarray
    """int64: the tensors that have readers, in entry order."""
    tensor_bytes: np.ndarray
    out_bytes: np.ndarray
    """int64 [N]: memory each node's outputs add (none for a view or an in-place op)."""
    weight_owner: np.ndarray
    """int64: the node of each (node, weight) entry."""
    nw_idx: np.ndarray
    weight_bytes: np.ndarray
    code_bytes: np.ndarray
    """int64 [N]: code bytes of each node (0 when folded)."""

    @classmethod
    def build(cls, analysis: Analysis, target: Target, ref_order: np.ndarray) -> StageMemory:
        flow = analysis.flow
        n = flow.num_nodes
        rank = np.empty(n, dtype=np.int64)
        rank[ref_order] = np.arange(n)
        counts = np.diff(flow.cons_ptr)
        tb = analysis.costs.tensor_bytes.astype(np.int64)
        has = counts > 0
        return cls(
            rank=rank,
            producer=flow.producer,
            cons_idx=flow.cons_idx,
            read_starts=flow.cons_ptr[:-1][has],
            read_tensors=np.flatnonzero(has),
            tensor_bytes=tb,
            out_bytes=analysis.node_new_bytes(),
            weight_owner=np.repeat(np.arange(n), np.diff(flow.nw_ptr)),
            nw_idx=flow.nw_idx,
            weight_bytes=flow.weight_bytes,
            code_bytes=node_code_bytes(analysis, target),
        )

    def bytes(self, before: np.ndarray, stage: np.ndarray) -> int:
        """Distinct weights + peak live bytes + code of the nodes in ``stage`` (bool [N]) after ``before``."""
        nodes = np.flatnonzero(stage)
        if not len(nodes):
            return 0
        nodes = nodes[np.argsort(self.rank[nodes], kind="stable")]
        size = len(nodes)
        pos = np.full(len(stage), -1, dtype=np.int64)
        pos[nodes] = np.arange(size)
        ws = self.nw_idx[stage[self.weight_owner]]
        weights = int(self.weight_bytes[np.unique(ws)].sum()) if len(ws) else 0

        # Per reader entry: -1 read earlier, its position in the stage, or ``size`` read later.
        readers = self.cons_idx
        where = np.where(before[readers], -1, np.where(stage[readers], pos[readers], size))
        first = np.minimum.reduceat(where, self.read_starts) if len(where) else where
        last = np.maximum.reduceat(where, self.read_starts) if len(where) else where
        t = self.read_tensors
        prod = self.producer[t]
        is_input, node = prod < 0, np.maximum(prod, 0)
        # Where each tensor appears in the stage: -1 before it (made by an earlier stage, or an
        # input an earlier stage reads first), its producer's position, or an input's first reader.
        earlier = np.where(is_input, first == -1, before[node])
        made = np.where(earlier, -1, np.where(is_input, first, pos[node]))
        known = is_input | earlier | stage[node]  # made by a later stage: not live here
        # Live on positions made+1 .. last (a received tensor from 0), inputs also at their first reader.
        start = made + 1
        stop = np.minimum(last, size - 1) + 1
        span = known & (last > made) & (stop > start)
        diff = np.zeros(size + 2, dtype=np.int64)
        np.add.at(diff, start[span], self.tensor_bytes[t[span]])
        np.add.at(diff, stop[span], -self.tensor_bytes[t[span]])
        live = np.cumsum(diff)[:size] + self.out_bytes[nodes]
        streamed = is_input & (first >= 0) & (first < size)
        np.add.at(live, first[streamed], self.tensor_bytes[t[streamed]])
        return weights + int(live.max()) + int(self.code_bytes[nodes].sum())
