"""Static shapes for every tensor: symbolic dims resolved from config, then ONNX shape inference.

Inference runs on a copy of the graph whose large initializers are swapped out for their
type alone, so a model with 1.9 GB of inline weights is not serialised twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from sharderd.errors import ModelInvalidError
from sharderd.graph.tensors import tensor_nbytes

__all__ = ["ShapeInfo", "TensorType", "infer_shapes", "resolve_input_dims", "shape_info", "type_only_copy"]

_STRIP_BYTES = 4096


@dataclass(frozen=True, slots=True)
class TensorType:
    elem_type: int
    shape: tuple[int, ...] | None
    """None when any dim stays unknown after inference."""


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    types: Mapping[str, TensorType]
    resolved_dims: Mapping[str, int]
    """Symbolic dims of graph inputs and the values they were given."""
    unresolved_dims: tuple[str, ...]
    """Symbolic dims no config value covered (their tensors have unknown size)."""
    inference_error: str | None


def resolve_input_dims(
    model: onnx.ModelProto, *, batch_size: int, dims: Mapping[str, int]
) -> tuple[dict[str, int], list[str]]:
    """Fix symbolic graph-input dims in place: named ones from ``dims``, a leading one from ``batch_size``.

    Negative or zero static dims on inputs are refused: they cannot be planned.
    """
    resolved: dict[str, int] = {}
    unresolved: list[str] = []
    initializer_names = {t.name for t in model.graph.initializer}
    # A name used as a leading dim anywhere is the batch: every axis with that name gets its value.
    named = dict(dims)
    for value in model.graph.input:
        shape = value.type.tensor_type.shape
        if value.name not in initializer_names and value.type.HasField("tensor_type") and shape.dim:
            first = shape.dim[0]
            if not first.HasField("dim_value") and first.dim_param:
                named.setdefault(first.dim_param, batch_size)
    for value in model.graph.input:
        if value.name in initializer_names or not value.type.HasField("tensor_type"):
            continue
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            unresolved.append(f"{value.name}: rank unknown")
            continue
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                if dim.dim_value <= 0:
                    raise ModelInvalidError(
                        f"graph input {value.name!r} has dim {axis} = {dim.dim_value}; dims must be >= 1"
                    )
                continue
            param = dim.dim_param
            if param and param in named:
                size = named[param]
            elif axis == 0:
                size = batch_size
            else:
                unresolved.append(f"{value.name}[{axis}]" + (f" ({param})" if param else ""))
                continue
            if param:
                resolved[param] = size
            dim.dim_value = size
    for tensor in model.graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise ModelInvalidError(f"initializer {tensor.name!r} has a negative dim {list(tensor.dims)}")
    return resolved, unresolved


def shape_info(model: onnx.ModelProto, *, batch_size: int, dims: Mapping[str, int]) -> ShapeInfo:
    """Shapes of every tensor for ``batch_size`` and named ``dims``; ``model`` is left untouched."""
    light = type_only_copy(model)
    resolved, unresolved = resolve_input_dims(light, batch_size=batch_size, dims=dims)
    types, error = infer_shapes(light)
    return ShapeInfo(types, resolved, tuple(unresolved), error)


def infer_shapes(light: onnx.ModelProto) -> tuple[dict[str, TensorType], str | None]:
    """Run ONNX shape inference (with data propagation) and collect every tensor's type.

    Inference failures are not fatal: what stays unknown is reported, and costs fall back.
    """
    error: str | None = None
    try:
        inferred = onnx.shape_inference.infer_shapes(
            light, check_type=False, strict_mode=False, data_prop=_data_prop_is_safe(light)
        )
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        inferred = light
    types: dict[str, TensorType] = {}
    _collect(inferred.graph, types)
    return types, error


_DATA_PROP_MAX_ELEMENTS = 1 << 16
"""onnx's data propagation keeps ~150 bytes per element of 1-D tensors: shape vectors are tiny,
a 2**24-element input would take gigabytes. Bigger 1-D tensors switch it off."""


def _data_prop_is_safe(model: onnx.ModelProto) -> bool:
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value") and dims[0].dim_value > _DATA_PROP_MAX_ELEMENTS:
            return False
    tensors = [*model.graph.initializer]
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    return not any(len(t.dims) == 1 and t.dims[0] > _DATA_PROP_MAX_ELEMENTS for t in tensors)


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
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor_nbytes(tensor) <= _STRIP_BYTES:
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


def _collect(graph: onnx.GraphProto, types: dict[str, TensorType]) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        tt = _tensor_type(value)
        if tt is not None and (value.name not in types or types[value.name].shape is None):
            types[value.name] = tt
    for tensor in graph.initializer:
        types[tensor.name] = TensorType(tensor.data_type, tuple(tensor.dims))
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and node.output:
                    types[node.output[0]] = TensorType(attr.t.data_type, tuple(attr.t.dims))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _collect(attr.g, types)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _collect(sub, types)


def _tensor_type(value: onnx.ValueInfoProto) -> TensorType | None:
    if not value.type.HasField("tensor_type"):
        return None
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorType(tensor_type.elem_type, None)
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return TensorType(tensor_type.elem_type, None)
        dims.append(dim.dim_value)
    return TensorType(tensor_type.elem_type, tuple(dims))
