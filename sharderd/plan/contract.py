"""Contract the nodes that never decide a split into their neighbours, so the exact DP over ideals
reaches real exports.

An exporter's graph is full of bookkeeping: ``Shape → Gather → Unsqueeze → Concat → Reshape``
chains beside every attention block, ``Constant`` nodes by the hundred. Each independent side
chain multiplies the number of ideals (tiny_bert: over 200,000 ideals over 418 nodes; 1,879 over
its 153 groups after contraction). Such a node costs no FLOPs, holds no weights and writes a few bytes,
so where it sits moves a stage's time by its per-op overhead and a few bytes of copy at most.

A node is *contractible* when it reads no weight, does no FLOPs and writes at most
``TINY_BYTES`` (shape arithmetic), or when it depends on no graph input (constant-only work of
any size, which the compiler folds anyway). It joins the group of its producers when they are all
in one group, else the group of its consumers when those are all in one group. Either merge keeps
the group graph acyclic: a cycle through the new member would have been a cycle before it joined.

The DP over the contracted graph is optimal over the splits that keep every group together;
``Groups.merged`` says whether that is every split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.graph.dataflow import Dataflow
from sharderd.plan.order import constant_only_nodes

__all__ = ["TINY_BYTES", "Groups", "contract", "refine"]

TINY_BYTES = 4096
"""Outputs up to this size are bookkeeping (shape vectors, scalars, masks of a few elements)."""


@dataclass(frozen=True, slots=True)
class Groups:
    of_node: np.ndarray
    """int64 [N]: group of each node, numbered 0..count-1 by their first member's topological position."""
    count: int
    pred: tuple[int, ...]
    """Bit mask of each group's predecessor groups."""
    succ: tuple[tuple[int, ...], ...]
    """Successor groups of each group."""
    node_preds: tuple[tuple[int, ...], ...]
    """``Dataflow.predecessors()``, kept so a refinement need not read the graph again."""

    @property
    def merged(self) -> int:
        """Nodes that share a group with another: 0 means the contracted graph is the graph."""
        return len(self.of_node) - self.count


def contract(analysis: Analysis, *, enabled: bool = True) -> Groups:
    """Groups of nodes that move together; ``enabled=False`` gives one group per node."""
    flow, costs = analysis.flow, analysis.costs
    n = flow.num_nodes
    topo = flow.topo_order.tolist()
    preds = flow.predecessors()
    succs = [
        sorted({int(c) for t in flow.outputs(q).tolist() for c in flow.consumers(t).tolist()})
        for q in range(n)
    ]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if enabled:
        out_bytes = np.zeros(n, dtype=np.int64)
        np.add.at(
            out_bytes,
            np.repeat(np.arange(n), np.diff(flow.out_ptr)),
            costs.tensor_bytes[flow.out_idx],
        )
        tiny = (costs.flops == 0) & (np.diff(flow.nw_ptr) == 0) & (out_bytes <= TINY_BYTES)
        movable = (tiny | constant_only_nodes(flow, flow.topo_order)).tolist()
        # Groups made of movable nodes only, by root: the ones that may still join a neighbour.
        members = {q: [q] for q in range(n) if movable[q]}
        changed = True
        while changed:
            changed = False
            for sweep, neighbours in ((topo, preds), (topo[::-1], succs)):
                for q in sweep:
                    group = members.get(q)
                    if group is None:
                        continue
                    around = {find(x) for m in group for x in neighbours[m]} - {q}
                    if len(around) != 1:
                        continue
                    (g,) = around
                    parent[q] = g
                    del members[q]
                    if g in members:
                        members[g].extend(group)
                    changed = True

    return _grouped(flow, np.array([find(q) for q in range(n)], dtype=np.int64), preds)


def refine(
    analysis: Analysis,
    groups: Groups,
    segment: np.ndarray,
    free: np.ndarray,
) -> Groups:
    """Groups cut along ``segment`` (int [N], non-decreasing along a topological order); a
    segment that is not ``free[segment]`` becomes one group of its own.

    Still acyclic: an edge goes to the same or a later segment; inside a free segment the parts
    are one per group, so a cycle of parts would be a cycle of groups; a fixed one is one group.
    """
    width = int(segment.max(initial=0)) + 1
    labels = np.where(free[segment], groups.of_node * width + segment, -1 - segment)
    return _grouped(analysis.flow, labels.astype(np.int64), groups.node_preds)


def _grouped(flow: Dataflow, labels: np.ndarray, preds: tuple[tuple[int, ...], ...]) -> Groups:
    """Groups from a label per node, numbered by the topological position of their first member."""
    number: dict[int, int] = {}
    for q in flow.topo_order.tolist():
        number.setdefault(int(labels[q]), len(number))
    of_node = np.array([number[int(r)] for r in labels.tolist()], dtype=np.int64)
    count = len(number)
    pred = [0] * count
    succ: list[set[int]] = [set() for _ in range(count)]
    for q, ps in enumerate(preds):
        gq = int(of_node[q])
        for p in ps:
            gp = int(of_node[p])
            if gp != gq:
                pred[gq] |= 1 << gp
                succ[gp].add(gq)
    return Groups(of_node, count, tuple(pred), tuple(tuple(sorted(s)) for s in succ), preds)
