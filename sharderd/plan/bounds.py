"""Bounds that hold for every valid split, whatever the order: the time no split beats, and the
memory facts that rule every split out. See docs/planning.md for the argument."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.op_costs import node_code_bytes
from sharderd.target import Target

__all__ = ["MemoryFloor", "Work", "lower_bound_all_splits", "memory_floor", "node_work"]


def lower_bound_all_splits(
    analysis: Analysis, target: Target, compute_s: np.ndarray, devices: int
) -> float:
    """max(total work / devices, the dearest node, the dearest streamed input with its cheapest reader).

    Every split pays each node's compute and host output on the node's stage, and each read graph
    input's host transfer exactly once, on the stage of its first reader; copies only add. So the
    sum of stage times is at least the total, and the slowest stage at least its share. A node's
    stage pays at least that node; an input's stage pays the transfer plus at least one reader.
    """
    flow, tb = analysis.flow, analysis.costs.tensor_bytes.astype(np.float64)
    work = node_work(analysis, target, compute_s)
    node, hbw = work.node_s, target.host_bytes_per_s
    worst = float(node.max()) if len(node) else 0.0
    for t in work.streamed.tolist():
        readers = flow.consumers(t)
        worst = max(worst, tb[t] / hbw + float(node[readers].min()))
    return float(max(work.total_s / devices, worst))


@dataclass(frozen=True, slots=True)
class Work:
    """What every split pays, whatever the order (``lower_bound_all_splits``)."""

    node_s: np.ndarray
    """float64 [N]: ``c(v)``, each node's compute plus its host output, paid on its own stage."""
    total_s: float
    """``W``: every ``c(v)`` plus the host transfer of every read graph input."""
    streamed: np.ndarray
    """int64: the graph inputs some node reads (each streamed once, to its first reader's stage)."""


def node_work(analysis: Analysis, target: Target, compute_s: np.ndarray) -> Work:
    flow, costs = analysis.flow, analysis.costs
    tb = costs.tensor_bytes.astype(np.float64)
    hbw = target.host_bytes_per_s
    node = compute_s.astype(np.float64).copy()
    outs_of = np.repeat(np.arange(flow.num_nodes), np.diff(flow.out_ptr))
    host_out = np.where(flow.is_graph_output[flow.out_idx], tb[flow.out_idx], 0.0)
    np.add.at(node, outs_of, host_out / hbw)
    counts = np.diff(flow.cons_ptr)
    streamed = np.flatnonzero((flow.producer < 0) & (counts > 0))
    return Work(node, float(node.sum() + tb[streamed].sum() / hbw), streamed)


@dataclass(frozen=True, slots=True)
class MemoryFloor:
    node_bytes: np.ndarray
    """float64 [N]: what a node needs on any device whatever the split: weights, inputs, the
    outputs that take new memory (``graph/buffers.py``), code."""
    total_bytes: float
    """Distinct weights + code of all nodes: the devices together hold at least this."""

    def min_devices(self, cap: float) -> int:
        """Fewest devices of ``cap`` bytes any split could need (a floor, not a promise)."""
        return max(1, math.ceil(self.total_bytes / cap))


def memory_floor(analysis: Analysis, target: Target) -> MemoryFloor:
    flow, costs = analysis.flow, analysis.costs
    n = flow.num_nodes
    tb = costs.tensor_bytes.astype(np.float64)
    code = node_code_bytes(analysis, target).astype(np.float64)
    node = code.copy()
    ins_of = np.repeat(np.arange(n), np.diff(flow.in_ptr))
    np.add.at(node, ins_of, tb[flow.in_idx])
    node += analysis.node_new_bytes()  # a view or in-place output reuses its input's memory
    ws_of = np.repeat(np.arange(n), np.diff(flow.nw_ptr))
    np.add.at(node, ws_of, flow.weight_bytes[flow.nw_idx].astype(np.float64))
    used = np.unique(flow.nw_idx)
    total = float(flow.weight_bytes[used].sum()) + float(code.sum())
    return MemoryFloor(node, total)
