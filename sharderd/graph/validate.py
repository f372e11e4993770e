"""Refuse tensors and value types the engine would mis-size or crash on, naming each, before planning.

Every size sharderd plans with comes from a tensor's dims × its type, never from its bytes; so a
type that is not ONNX's, or data that disagrees with the dims (one dim too many, a cut ``raw_data``,
an external ``length`` of another size), would be planned on a size the compiler never sees, or
crash later. The data a tensor holds must be exactly its dims × type: ``raw_data``'s length, the
count of its typed field, or its external ``length``. A tensor holding no data at all is a stub
(tools that strip weights write them) and is sized by its dims, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
from onnx import TensorProto

from sharderd.errors import ModelInvalidError
from sharderd.graph.tensors import BITS_PER_ELEMENT, all_tensors, shape_bytes

__all__ = ["check_tensors", "check_value_types"]

_TYPED_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)
_COMPLEX = frozenset({TensorProto.COMPLEX64, TensorProto.COMPLEX128})
_ONNX_TYPES = frozenset(TensorProto.DataType.values())


def check_tensors(model: onnx.ModelProto, where: str) -> None:
    """Raise ``ModelInvalidError`` for the first tensor whose type or data is wrong (see module doc)."""
    for owner, tensor in _tensors(model):
        _check_tensor(tensor.name or owner, tensor, where)


def check_value_types(model: onnx.ModelProto, where: str) -> None:
    """Graph inputs, outputs and value_info (bodies included) must have an ONNX element type."""
    for kind, value in _value_infos(model.graph):
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type not in _ONNX_TYPES:
            raise ModelInvalidError(
                f"{where}: {kind} {value.name!r} has element type {tensor_type.elem_type}, which is "
                "not an ONNX data type",
                hint="re-export the model; onnx's checker names the same value",
            )


def _check_tensor(name: str, tensor: TensorProto, where: str) -> None:
    dtype = tensor.data_type
    if dtype not in BITS_PER_ELEMENT:
        what = (
            "no data type (UNDEFINED)"
            if dtype == 0
            else f"data type {TensorProto.DataType.Name(dtype)}, which sharderd cannot size"
            if dtype in _ONNX_TYPES
            else f"data type {dtype}, which is not an ONNX data type"
        )
        raise ModelInvalidError(
            f"{where}: tensor {name!r} has {what}",
            hint="re-export the model; onnx's checker names the same tensor",
        )
    if any(d < 0 for d in tensor.dims):
        raise ModelInvalidError(f"{where}: tensor {name!r} has a negative dim {list(tensor.dims)}")
    numel = math.prod(tensor.dims)
    need = shape_bytes(tuple(tensor.dims), dtype)
    field = onnx.helper.tensor_dtype_to_field(dtype)
    held = [f for f in _TYPED_FIELDS if len(getattr(tensor, f))]
    if tensor.HasField("raw_data"):
        held.append("raw_data")
    if tensor.data_location == TensorProto.EXTERNAL:
        held.append("external data")
    if len(held) > 1:
        raise ModelInvalidError(
            f"{where}: tensor {name!r} holds its data twice ({', '.join(held)})"
        )
    if not held:
        return
    shape = f"its dims {list(tensor.dims)} × {TensorProto.DataType.Name(dtype)}"
    if held[0] == "raw_data":
        if dtype == TensorProto.STRING:
            raise ModelInvalidError(f"{where}: string tensor {name!r} holds raw_data")
        if len(tensor.raw_data) != need:
            raise _disagree(
                where, name, f"raw_data holds {len(tensor.raw_data)} bytes", shape, need
            )
    elif held[0] == "external data":
        info = {entry.key: entry.value for entry in tensor.external_data}
        if "length" in info and info["length"].strip().isdigit() and int(info["length"]) != need:
            raise _disagree(where, name, f"external length is {info['length']}", shape, need)
    elif held[0] != field:
        raise ModelInvalidError(
            f"{where}: tensor {name!r} of type {TensorProto.DataType.Name(dtype)} holds {held[0]}; "
            f"its values belong in {field} or raw_data"
        )
    else:
        count = len(getattr(tensor, field))
        bits = BITS_PER_ELEMENT[dtype]
        expected = -(-numel * bits // 8) if bits < 8 else numel * (2 if dtype in _COMPLEX else 1)
        if count != expected:
            raise ModelInvalidError(
                f"{where}: tensor {name!r} holds {count} value(s) in {field}, but {shape} needs {expected}",
                hint="the dims and the data disagree: re-export the model",
            )


def _disagree(where: str, name: str, held: str, shape: str, need: int) -> ModelInvalidError:
    return ModelInvalidError(
        f"{where}: tensor {name!r}'s {held}, but {shape} is {need} bytes",
        hint="the dims and the data disagree: re-export the model",
    )


def _tensors(model: onnx.ModelProto) -> Iterator[tuple[str, TensorProto]]:
    yield from all_tensors(model.graph)
    for graph in _graphs(model.graph):
        for sparse in graph.sparse_initializer:
            yield f"{sparse.values.name} (its indices)", sparse.indices
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t.name or node.name, attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from ((t.name or node.name, t) for t in attr.tensors)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def _value_infos(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.ValueInfoProto]]:
    for sub in _graphs(graph):
        yield from (("graph input", v) for v in sub.input)
        yield from (("graph output", v) for v in sub.output)
        yield from (("value_info", v) for v in sub.value_info)
