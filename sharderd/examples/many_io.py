"""``multi_io``: two inputs, three outputs, one of them also consumed."""

from __future__ import annotations

import math

import numpy as np
import onnx

from sharderd.examples.builder import (
    Graph,
    float_info,
    graph_model,
    normal,
    positive,
)


def multi_io(
    *, hidden: int = 64, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """Two inputs and three outputs; ``b`` is read at the start and again near the end.

    ``out_sum`` is a graph output that later nodes also consume, so a stage boundary after it must
    both return it and pass it on.
    """
    positive(hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)

    def square(name: str) -> str:
        return g.weight(name, normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden)))

    a = g.op("MatMul", "/a/MatMul", "a", square("a.weight"))
    b = g.op("MatMul", "/b/MatMul", "b", square("b.weight"))
    x = g.op("Add", "/sum/Add", a, "b", out="out_sum")
    g.op("Mul", "/prod/Mul", a, b, out="out_prod")
    for i in range(3):
        x = g.op("MatMul", f"/deep/MatMul_{i}", x, square(f"deep.{i}.weight"))
        x = g.op("Relu", f"/deep/Relu_{i}", x)
    x = g.op("Add", "/deep/Add_b", x, "b")
    g.op("MatMul", "/deep/MatMul_out", x, square("deep.out.weight"), out="out_deep")

    io = [batch, hidden]
    graph = g.to_graph(
        "multi_io",
        [float_info("a", io), float_info("b", io)],
        [float_info(name, io) for name in ("out_sum", "out_prod", "out_deep")],
    )
    return graph_model(graph, "two inputs, three outputs, b consumed early and late")
