"""Candidate topological orders. The partitioner is exact on one order; the order decides how
cheap the cuts can be, so a few orders are tried and the best plan wins.

- ``file``: the model's own order (exporters emit layers in sequence; usually good).
- ``depth_first``: finish a branch before starting the next, so fewer tensors stay live
  across a cut (skip connections, parallel attention heads, Inception-style branches).
- ``level``: by depth (longest path from an input), so parallel branches advance together and a
  cut can take the first half of every branch (``{a1, b1} | {a2, b2}``), which neither order
  above offers.

Both keep constant-only work (``Constant``, shape arithmetic on initializers) next to its first
consumer, so a model whose constants sit at the top does not drag them across every cut.
"""

from __future__ import annotations

import numpy as np

from sharderd.graph.dataflow import Dataflow

__all__ = [
    "ORDER_NAMES",
    "candidate_orders",
    "constant_only_nodes",
    "depth_first_order",
    "level_order",
]

ORDER_NAMES = ("file", "depth_first", "level")


def constant_only_nodes(flow: Dataflow, base: np.ndarray) -> np.ndarray:
    """bool [N]: nodes that read no graph input, directly or through other nodes."""
    const = np.zeros(flow.num_nodes, dtype=bool)
    producer = flow.producer
    for node in base.tolist():
        inputs = flow.inputs(node)
        const[node] = all(producer[t] >= 0 and const[producer[t]] for t in inputs.tolist())
    return const


def _sink_constants(
    flow: Dataflow, base: np.ndarray, const: np.ndarray, has_consumer: np.ndarray
) -> np.ndarray:
    """Emit constant-only nodes lazily, right before the first node that needs them.

    ``const`` and ``has_consumer`` do not depend on the order: computed once for all orders."""
    if not const.any():
        return base
    emitted = np.zeros(flow.num_nodes, dtype=bool)
    producer = flow.producer
    out: list[int] = []

    def emit_constant_ancestors(node: int) -> None:
        stack = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            if expanded:
                if not emitted[current]:
                    emitted[current] = True
                    out.append(current)
                continue
            stack.append((current, True))
            for t in flow.inputs(current).tolist():
                p = int(producer[t])
                if p >= 0 and const[p] and not emitted[p]:
                    stack.append((p, False))

    for node in base.tolist():
        if emitted[node]:
            continue
        if const[node] and has_consumer[node]:
            continue
        emit_constant_ancestors(node)
    return np.asarray(out, dtype=np.int64)


def depth_first_order(flow: Dataflow) -> np.ndarray:
    """Kahn's algorithm with a stack: the consumers a node just made ready run next."""
    n = flow.num_nodes
    producer = flow.producer
    indegree = np.zeros(n, dtype=np.int64)
    for node in range(n):
        indegree[node] = sum(1 for t in flow.inputs(node).tolist() if producer[t] >= 0)
    stack = [int(x) for x in np.flatnonzero(indegree == 0)[::-1]]
    order: list[int] = []
    remaining = indegree.tolist()
    while stack:
        node = stack.pop()
        order.append(node)
        ready: list[int] = []
        for t in flow.outputs(node).tolist():
            for c in flow.consumers(t).tolist():
                remaining[c] -= 1
                if remaining[c] == 0:
                    ready.append(c)
        stack.extend(sorted(ready, reverse=True))
    return np.asarray(order, dtype=np.int64)


def level_order(flow: Dataflow) -> np.ndarray:
    """Nodes sorted by depth (longest path from a graph input), file order within a depth."""
    topo = flow.topo_order
    depth = np.zeros(flow.num_nodes, dtype=np.int64)
    producer = flow.producer
    in_ptr, in_idx = flow.in_ptr, flow.in_idx
    depth_list = depth.tolist()
    for node in topo.tolist():
        best = 0
        for t in in_idx[in_ptr[node] : in_ptr[node + 1]].tolist():
            p = int(producer[t])
            if p >= 0 and depth_list[p] + 1 > best:
                best = depth_list[p] + 1
        depth_list[node] = best
    depth = np.asarray(depth_list, dtype=np.int64)
    rank = np.empty(flow.num_nodes, dtype=np.int64)
    rank[topo] = np.arange(flow.num_nodes)
    return np.lexsort((rank, depth)).astype(np.int64)


def candidate_orders(flow: Dataflow) -> dict[str, np.ndarray]:
    """The orders to plan on, deduplicated (a chain has only one)."""
    orders: dict[str, np.ndarray] = {}
    const = constant_only_nodes(flow, flow.topo_order)
    readers = np.diff(flow.cons_ptr) > 0
    has_consumer = np.zeros(flow.num_nodes, dtype=bool)
    node_of_out = np.repeat(np.arange(flow.num_nodes), np.diff(flow.out_ptr))
    np.logical_or.at(has_consumer, node_of_out, readers[flow.out_idx])
    for name, base in (
        ("file", flow.topo_order),
        ("depth_first", depth_first_order(flow)),
        ("level", level_order(flow)),
    ):
        order = _sink_constants(flow, base, const, has_consumer)
        if not any(np.array_equal(order, seen) for seen in orders.values()):
            orders[name] = order
    return orders
