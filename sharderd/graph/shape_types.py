"""What shape inference says about a tensor, read off ``ValueInfoProto``s: the types every shape
engine (graph/propagate.py, graph/symbolic.py, graph/fixed_point.py) fills in."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

__all__ = [
    "DataDependentShape",
    "TensorType",
    "add_constants",
    "collect_types",
    "collect_value_infos",
    "static_type",
]


@dataclass(frozen=True, slots=True)
class TensorType:
    elem_type: int
    shape: tuple[int, ...] | None
    """None when any dim stays unknown after inference."""


@dataclass(frozen=True, slots=True)
class DataDependentShape:
    """A tensor whose size depends on the data (NonZero, TopK with a computed k, ...)."""

    tensor: str
    node: str
    op_type: str
    costed_as: str
    """How the plan counted it, for the report."""


def collect_value_infos(graph: onnx.GraphProto, out: dict[str, onnx.ValueInfoProto]) -> None:
    """Every typed value ``graph`` and its bodies declare into ``out`` (a static one wins)."""
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and (
            value.name not in out or static_type(out[value.name]).shape is None
        ):
            out[value.name] = value
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                collect_value_infos(attr.g, out)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    collect_value_infos(sub, out)


def collect_types(graph: onnx.GraphProto) -> dict[str, TensorType]:
    """Static types of what ``graph`` (and its bodies) declares; symbolic dims make a shape unknown."""
    raw: dict[str, onnx.ValueInfoProto] = {}
    collect_value_infos(graph, raw)
    types = {name: static_type(value) for name, value in raw.items()}
    add_constants(graph, types)
    return types


def add_constants(graph: onnx.GraphProto, types: dict[str, TensorType]) -> None:
    """The types of initializers and ``Constant`` outputs, which no inference needs to find."""
    for tensor in graph.initializer:
        types[tensor.name] = TensorType(tensor.data_type, tuple(tensor.dims))
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = TensorType(attr.t.data_type, tuple(attr.t.dims))
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                add_constants(sub, types)


def static_type(value: onnx.ValueInfoProto) -> TensorType:
    """The value's element type, and its shape when every dim is a number."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorType(tensor_type.elem_type, None)
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return TensorType(tensor_type.elem_type, None)
        dims.append(dim.dim_value)
    return TensorType(tensor_type.elem_type, tuple(dims))
