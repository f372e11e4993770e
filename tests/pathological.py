"""Small models that cost far more than their size: ``If`` nested deep under a constant condition.

onnxruntime's symbolic shape inference infers the taken branch of an ``If`` whose condition it
knows in place of the other one too, so its work doubles with each level: the issue's 6 KB model
nested 20 deep never finished planning. ``nested_if(20)`` is such a model (3 KB).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

__all__ = ["nested_if"]


def nested_if(depth: int, *, width: int = 1) -> onnx.ModelProto:
    """``If`` nested ``depth`` deep (each then-branch holds the next), all on one constant condition;
    every else-branch and the innermost then-branch are ``width`` Relus on the graph input."""

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4])

    def chain(prefix: str) -> tuple[list[onnx.NodeProto], str]:
        nodes, src = [], "x"
        for i in range(width):
            nodes.append(helper.make_node("Relu", [src], [f"{prefix}_{i}"], name=f"{prefix}_{i}"))
            src = f"{prefix}_{i}"
        return nodes, src

    def level(d: int) -> onnx.GraphProto:
        if d == depth:
            nodes, last = chain(f"leaf{d}")
            return helper.make_graph(nodes, f"leaf{d}", [], [info(last)])
        other, last = chain(f"else{d}")
        node = helper.make_node(
            "If",
            ["cond"],
            [f"y{d}"],
            name=f"if{d}",
            then_branch=level(d + 1),
            else_branch=helper.make_graph(other, f"else{d}", [], [info(last)]),
        )
        return helper.make_graph([node], f"then{d}", [], [info(f"y{d}")])

    cond = helper.make_node(
        "Constant",
        [],
        ["cond"],
        name="cond",
        value=helper.make_tensor("cond_value", TensorProto.BOOL, [], [True]),
    )
    top = level(0)
    graph = helper.make_graph(
        [cond, *top.node], "nested_if", [info("x")], [info(top.output[0].name)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
