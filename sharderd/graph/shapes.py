"""Static shapes for every tensor: inputs fixed to the planned shapes, then values propagated.

Inference runs on a copy of the graph whose weights are typed inputs (``propagate.inference_copy``),
so a model with 1.9 GB of inline weights is neither serialised twice nor read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import onnx
from onnx.helper import np_dtype_to_tensor_dtype

from sharderd.graph.evaluate import constant_values, with_values
from sharderd.graph.input_dims import UnresolvedDim, fix_input_dims, graph_inputs
from sharderd.graph.propagate import (
    DataDependentShape,
    Propagation,
    TensorType,
    inference_copy,
    propagate_shapes,
)
from sharderd.graph.tensors import tensor_nbytes

__all__ = [
    "DataDependentShape",
    "ShapeInfo",
    "TensorType",
    "UnresolvedDim",
    "shape_info",
    "type_only_copy",
]

_STRIP_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    types: Mapping[str, TensorType]
    input_shapes: Mapping[str, tuple[int, ...]]
    """Every graph input's static shape as planned: what the sharded model is written with."""
    resolved_dims: Mapping[str, int]
    """Symbolic dims of graph inputs and the values they were given."""
    unresolved: tuple[UnresolvedDim, ...]
    """Symbolic input dims nothing gave a value (the caller refuses to plan)."""
    engine: str
    """Which shape inference produced ``types``."""
    inference_error: str | None
    data_dependent: tuple[DataDependentShape, ...]
    notes: tuple[str, ...]

    @property
    def unresolved_dims(self) -> tuple[str, ...]:
        return tuple(d.describe() for d in self.unresolved)


def shape_info(
    model: onnx.ModelProto,
    *,
    batch_size: int,
    dims: Mapping[str, int],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> ShapeInfo:
    """Shapes of every tensor at the planned input shapes; ``model`` is left untouched.

    With dims left open, nothing is inferred: planning on unknown sizes is what this prevents.
    """
    light = inference_copy(model)
    real = {v.name for v in graph_inputs(model.graph)}
    fixed = fix_input_dims(
        light.graph, batch_size=batch_size, dims=dims, input_shapes=input_shapes or {}, only=real
    )
    if fixed.unresolved:
        return ShapeInfo({}, fixed.shapes, fixed.resolved, fixed.unresolved, "none", None, (), ())
    result = propagate_shapes(light)
    if _unknown(light.graph, result.types):
        result = _with_constants_evaluated(light, result)
    return ShapeInfo(
        result.types,
        fixed.shapes,
        fixed.resolved,
        (),
        result.engine,
        result.error,
        result.data_dependent,
        result.notes,
    )


def _unknown(graph: onnx.GraphProto, types: Mapping[str, TensorType]) -> int:
    return sum(
        1
        for node in graph.node
        for o in node.output
        if o and (types.get(o) is None or types[o].shape is None)
    )


def _with_constants_evaluated(light: onnx.ModelProto, first: Propagation) -> Propagation:
    """Infer again with the constant expressions' values as initializers (graph/evaluate.py); keep
    whichever result leaves fewer tensors unknown."""
    opset = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = constant_values(light.graph, first.types, opset)
    if not values:
        return first
    again = propagate_shapes(with_values(light, values))
    types = dict(again.types)
    for name, value in values.items():
        types[name] = TensorType(np_dtype_to_tensor_dtype(value.dtype), tuple(value.shape))
    if _unknown(light.graph, types) >= _unknown(light.graph, first.types):
        return first
    return replace(again, types=types)


def type_only_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for inference: big initializers become dims + dtype stubs (inference needs no values).

    The source is never touched, and no weight bytes are copied or measured (``ByteSize`` on a
    model with 2 GB of inline weights costs seconds).
    """
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    source, graph = model.graph, light.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.sparse_initializer.extend(source.sparse_initializer)
    for tensor in source.initializer:
        if (
            tensor.data_location == onnx.TensorProto.EXTERNAL
            or tensor_nbytes(tensor) <= _STRIP_BYTES
        ):
            graph.initializer.append(tensor)  # small values (Reshape targets) feed data propagation
            continue
        stub = graph.initializer.add()
        stub.name = tensor.name
        stub.data_type = tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        entry = stub.external_data.add()
        entry.key, entry.value = "location", "__sharderd_stripped__"
    return light
