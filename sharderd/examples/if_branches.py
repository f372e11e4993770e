"""``with_if``: weights inside ``If`` branches that read an outer-scope tensor."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from sharderd.examples.builder import (
    Graph,
    float_info,
    graph_model,
    normal,
    positive,
    scalar,
)


def with_if(
    *, hidden: int = 64, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """A model whose weights partly live inside ``If`` branches that read an outer-scope tensor.

    The then-branch holds its weight in a ``Constant`` node, the else-branch as a subgraph initializer;
    both read ``/pre/MatMul_output_0`` without listing it as an input. The sign of ``x`` picks the
    branch (the condition is linear in ``x``), so tests can run both.
    """
    positive(hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)

    def square() -> np.ndarray:
        return normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden))

    h = g.op("MatMul", "/pre/MatMul", "x", g.weight("pre.weight", square()))
    total = g.op("ReduceSum", "/pre/ReduceSum", h, keepdims=0)
    cond = g.op("Greater", "/pre/Greater", total, g.weight("pre.zero", scalar(0.0)))
    branch_out = [batch, hidden]

    then = Graph(name_nodes=name_nodes)
    constant = numpy_helper.from_array(square(), "if.then.weight")
    w = then.op("Constant", "/if/then/Constant", value=constant)
    y = then.op("MatMul", "/if/then/MatMul", h, w)
    y = then.op("Relu", "/if/then/Relu", y)
    then_graph = then.to_graph("then_branch", [], [float_info(y, branch_out)])

    other = Graph(name_nodes=name_nodes)
    y = other.op("MatMul", "/if/else/MatMul", h, other.weight("if.else.weight", square()))
    y = other.op("Tanh", "/if/else/Tanh", y)
    else_graph = other.to_graph("else_branch", [], [float_info(y, branch_out)])

    x = g.op("If", "/if/If", cond, then_branch=then_graph, else_branch=else_graph)
    x = g.op("MatMul", "/post/MatMul_0", x, g.weight("post.0.weight", square()))
    x = g.op("Relu", "/post/Relu", x)
    g.op("MatMul", "/post/MatMul_1", x, g.weight("post.1.weight", square()), out="y")
    graph = g.to_graph(
        "with_if", [float_info("x", [batch, hidden])], [float_info("y", [batch, hidden])]
    )
    return graph_model(graph, "If with weights in both branches and an implicit outer-scope input")
