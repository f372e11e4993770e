"""``wide_head``: a small MatMul chain, then one wide projection whose own time dominates."""

from __future__ import annotations

import numpy as np
import onnx

from sharderd.examples.builder import Graph, float_info, graph_model, normal, positive


def wide_head(
    *,
    layers: int = 8,
    hidden: int = 128,
    vocab: int = 8192,
    rows: int = 64,
    name_nodes: bool = True,
    seed: int = 0,
) -> onnx.ModelProto:
    """x[rows, hidden] → ``layers`` × (MatMul hidden×hidden, Relu) → MatMul hidden×vocab (the head,
    a constant weight) → ReduceMax over the vocabulary → y[rows, 1].

    The head costs ``vocab / hidden`` times one layer's MatMul, so at the defaults its own time is
    more than all devices' share of the total on 4 devices: no split of the model as it is can be
    balanced, which is what serializing it into column pieces is for. The ReduceMax keeps the
    graph's output small, so the host transfer does not hide the head's time.
    """
    positive(layers=layers, hidden=hidden, vocab=vocab, rows=rows)
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)
    x = "x"
    for k in range(layers):
        weight = g.weight(f"w{k}", normal(rng, hidden, hidden, scale=1.0 / np.sqrt(hidden)))
        x = g.op("Relu", f"Relu_{k}", g.op("MatMul", f"MatMul_{k}", x, weight))
    head = g.weight("head", normal(rng, hidden, vocab, scale=1.0 / np.sqrt(hidden)))
    logits = g.op("MatMul", "MatMul_head", x, head)
    g.op("ReduceMax", "ReduceMax_head", logits, out="y", axes=[-1], keepdims=1)
    graph = g.to_graph("wide_head", [float_info("x", [rows, hidden])], [float_info("y", [rows, 1])])
    return graph_model(graph, "a MatMul chain, then a wide projection and a max over it")
