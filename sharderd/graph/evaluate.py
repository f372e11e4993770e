"""Constant expressions evaluated once the inputs are static, so computed shapes become numbers.

Symbolic shape inference decides most shape arithmetic, not all: a Swin-style window pad computed
as ``(w - H % w) % w`` from ``Shape`` leaves the ``Pad`` and everything after it of unknown size.
With the input shapes fixed those pads are plain numbers. When inference leaves tensors unknown,
this module evaluates the constant expressions with onnx's reference evaluator
(``onnx.reference.ReferenceEvaluator``, node by node), and ``shapes.shape_info`` infers again with
their values as initializers. docs/shapes.md says why this evaluator.

Never a big weight is read: only initializers of at most ``VALUE_BYTES`` (not external) and
``Shape``/``Size`` of static tensors are sources, and a node is evaluated only when its inputs are
known and its outputs stay that small (a ``Transpose`` or ``Cast`` of a weight is left alone: it is a
weight of its result's size, costed by graph/folding.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.reference import ReferenceEvaluator

from sharderd.graph.propagate import TensorType
from sharderd.graph.tensors import tensor_nbytes

__all__ = ["VALUE_BYTES", "constant_values", "with_values"]

VALUE_BYTES = 4096
"""Largest constant evaluated or kept: shape-sized (the same bound propagate.py keeps values under)."""

_NOT_EVALUATED = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
    | {"Bernoulli", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty"}
)
_SIZED_BY_VALUES = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Pad"})
"""Ops whose output size comes from input values: evaluated only when inference sized it small."""


def constant_values(
    graph: onnx.GraphProto, types: Mapping[str, TensorType], opset: int
) -> dict[str, np.ndarray]:
    """Values of the node outputs computable from small constants (``graph`` in topological order,
    its default-domain ``opset``)."""
    inputs = {i.name for i in graph.input}
    known: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        if (
            t.name not in inputs
            and t.data_location != onnx.TensorProto.EXTERNAL
            and tensor_nbytes(t) <= VALUE_BYTES
        ):
            try:
                known[t.name] = onnx.numpy_helper.to_array(t)
            except (ValueError, TypeError):  # malformed data: analysis reports it, not this
                continue
    computed: dict[str, np.ndarray] = {}
    for node in graph.node:
        values = _evaluate(node, known, types, opset)
        if values is None:
            continue
        for name, value in zip(node.output, values, strict=False):
            if name and isinstance(value, np.ndarray) and value.nbytes <= VALUE_BYTES:
                known[name] = computed[name] = value
    return computed


def _evaluate(
    node: onnx.NodeProto,
    known: Mapping[str, np.ndarray],
    types: Mapping[str, TensorType],
    opset: int,
) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_EVALUATED:
        return None
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return None
    named = [name for name in node.input if name]
    if node.op_type in ("Shape", "Size"):
        tt = types.get(named[0]) if named else None
        if tt is None or tt.shape is None:
            return None
        return _shape_without_data(node, tt.shape)
    elif all(name in known for name in named):
        if node.op_type in _SIZED_BY_VALUES and not all(_small(types.get(o)) for o in node.output):
            return None
        feeds = {name: known[name] for name in named}
    else:
        return None
    graph = onnx.helper.make_graph(
        [node],
        "constant",
        [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape
            )
            for n, v in feeds.items()
        ],
        [
            onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
            for o in node.output
            if o
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        return list(ReferenceEvaluator(model).run(None, feeds))
    except Exception:  # an op the reference cannot run is left for inference to size
        return None


def _shape_without_data(node: onnx.NodeProto, shape: tuple[int, ...]) -> list[np.ndarray]:
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape)), dtype=np.int64)]
    attrs = {a.name: a.i for a in node.attribute}
    end = attrs["end"] if "end" in attrs else len(shape)  # Shape-15 slicing, negatives included
    return [np.array(shape[attrs.get("start", 0) : end], dtype=np.int64)]


def _small(tt: TensorType | None) -> bool:
    if tt is None or tt.shape is None:
        return False
    return int(np.prod(tt.shape)) * 8 <= VALUE_BYTES


def with_values(light: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``light`` with the nodes whose outputs all have ``values`` replaced by those initializers."""
    copy = onnx.ModelProto()
    copy.ir_version = light.ir_version
    copy.opset_import.extend(light.opset_import)
    copy.functions.extend(light.functions)
    source, graph = light.graph, copy.graph
    graph.name = source.name
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.initializer.extend(source.initializer)
    graph.sparse_initializer.extend(source.sparse_initializer)
    outputs = {o.name for o in source.output}
    for node in source.node:
        outs = [o for o in node.output if o]
        if outs and all(o in values and o not in outputs for o in outs):
            graph.initializer.extend(onnx.numpy_helper.from_array(values[o], o) for o in outs)
        else:
            graph.node.append(node)
    return copy
