"""Fake ``poprt.profile``: per-node FLOPs (a multiply-add counts 2).

``Profiler().get_profiler(op_type)`` returns a callable for *any* op type, and the callable
accepts an empty array for a shape it does not know (the auto-sharding tool passes those,
poprt-facts.md §4); unknown shapes and unknown op types count 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper

__all__ = ["Profiler", "get_model_flops"]

Shapes = Sequence[np.ndarray]
NodeFlops = Callable[[onnx.NodeProto, Shapes, Shapes], int]

_ELEMENTWISE = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Sqrt",
        "Pow",
        "Exp",
        "Log",
        "Neg",
        "Abs",
        "Max",
        "Min",
        "Where",
        "Clip",
        "LeakyRelu",
        "HardSigmoid",
        "HardSwish",
        "Cast",
        "Equal",
        "Less",
        "Greater",
        "Not",
        "And",
        "Or",
    }
)
_PER_ELEMENT = {"Softmax": 5, "LayerNormalization": 8, "BatchNormalization": 4, "Gelu": 8}
_REDUCTIONS = frozenset(
    {"ReduceMean", "ReduceSum", "ReduceMax", "GlobalAveragePool", "AveragePool", "MaxPool"}
)


def _numel(shape: np.ndarray) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 0


def _first(shapes: Shapes, index: int = 0) -> np.ndarray:
    return (
        np.asarray(shapes[index], dtype=np.int64) if len(shapes) > index else np.zeros(0, np.int64)
    )


def _matmul(node: onnx.NodeProto, inputs: Shapes, outputs: Shapes) -> int:
    a, out = _first(inputs), _first(outputs)
    if not len(a) or not len(out):
        return 0
    transposed = any(x.name == "transA" and helper.get_attribute_value(x) for x in node.attribute)
    k = int(a[-2] if transposed and len(a) >= 2 else a[-1])
    return 2 * _numel(out) * k


def _conv(node: onnx.NodeProto, inputs: Shapes, outputs: Shapes) -> int:
    weight, out = _first(inputs, 1), _first(outputs)
    if len(weight) < 3 or not len(out):
        return 0
    return 2 * _numel(out) * _numel(weight[1:])


def _elementwise(node: onnx.NodeProto, inputs: Shapes, outputs: Shapes) -> int:
    return _numel(_first(outputs)) * _PER_ELEMENT.get(node.op_type, 1)


def _reduction(node: onnx.NodeProto, inputs: Shapes, outputs: Shapes) -> int:
    return _numel(_first(inputs))


def _free(node: onnx.NodeProto, inputs: Shapes, outputs: Shapes) -> int:
    return 0


class Profiler:
    """Looks up a FLOP counter by op type; never fails for an op type."""

    def get_profiler(self, op_type: str) -> NodeFlops:
        if op_type in ("MatMul", "Gemm"):
            return _matmul
        if op_type in ("Conv", "ConvTranspose"):
            return _conv
        if op_type in _ELEMENTWISE or op_type in _PER_ELEMENT:
            return _elementwise
        if op_type in _REDUCTIONS:
            return _reduction
        return _free


def get_model_flops(model: onnx.ModelProto, verbose: bool = False) -> int:
    """Whole-model FLOPs after shape inference (the second argument is accepted and ignored)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = _value_shapes(inferred.graph)
    profiler = Profiler()
    return sum(
        profiler.get_profiler(node.op_type)(
            node,
            [shapes.get(name, np.zeros(0, np.int64)) for name in node.input],
            [shapes.get(name, np.zeros(0, np.int64)) for name in node.output],
        )
        for node in inferred.graph.node
    )


def _value_shapes(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    shapes: dict[str, np.ndarray] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape"):
            shapes[value.name] = np.array(
                [d.dim_value if d.HasField("dim_value") else 1 for d in dims], np.int64
            )
    for init in graph.initializer:
        shapes[init.name] = np.array(init.dims, np.int64)
    return shapes
