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
from collections.abc import Iterable, Iterator

import onnx
from onnx import TensorProto

from sharderd.errors import ModelInvalidError
from sharderd.graph.tensors import BITS_PER_ELEMENT, shape_bytes

__all__ = ["check_tensors_and_values"]

_DATA_FIELDS = frozenset(
    {"float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"}
    | {"raw_data"}
)
"""The fields a tensor's values can be in (besides external data)."""
_COMPLEX = frozenset({TensorProto.COMPLEX64, TensorProto.COMPLEX128})
_ONNX_TYPES = frozenset(TensorProto.DataType.values())
_FIELD = {dtype: onnx.helper.tensor_dtype_to_field(dtype) for dtype in BITS_PER_ELEMENT}
"""The typed field each data type's values go in."""


def check_tensors_and_values(model: onnx.ModelProto, where: str) -> None:
    """Raise ``ModelInvalidError`` for the first tensor whose type or data is wrong, or graph
    input, output or value_info whose element type ONNX does not define (see module doc)."""
    for graph in _graphs(model.graph, where):
        for tensor in graph.initializer:
            _check_tensor(tensor.name, tensor, where)
        for sparse in graph.sparse_initializer:
            _check_tensor(sparse.values.name, sparse.values, where)
            _check_tensor(f"{sparse.values.name} (its indices)", sparse.indices, where)
        for kind, values in (
            ("graph input", graph.input),
            ("graph output", graph.output),
            ("value_info", graph.value_info),
        ):
            for value in values:
                elem_type = value.type.tensor_type.elem_type
                if elem_type not in _ONNX_TYPES:
                    raise ModelInvalidError(
                        f"{where}: {kind} {value.name!r} has element type {elem_type}, which is "
                        "not an ONNX data type",
                        hint="re-export the model; onnx's checker names the same value",
                    )
    for function in model.functions:
        _check_nodes(function.node, where)


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
    dims = tensor.dims
    if dims and min(dims) < 0:
        raise ModelInvalidError(f"{where}: tensor {name!r} has a negative dim {list(tensor.dims)}")
    held = [fd.name for fd, _ in tensor.ListFields() if fd.name in _DATA_FIELDS]
    if tensor.data_location == TensorProto.EXTERNAL:
        held.append("external data")
    if len(held) > 1:
        raise ModelInvalidError(
            f"{where}: tensor {name!r} holds its data twice ({', '.join(held)})"
        )
    if not held:
        return
    numel = math.prod(tensor.dims)
    need = shape_bytes(tuple(tensor.dims), dtype)
    field = _FIELD[dtype]
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


def _graphs(graph: onnx.GraphProto, where: str = "") -> Iterator[onnx.GraphProto]:
    """``graph`` and every body in it, at any depth; the tensors node attributes hold are checked
    on the way (one pass over the nodes)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            kind = attr.type
            if kind == onnx.AttributeProto.TENSOR:
                _check_tensor(
                    attr.t.name or node.name or next(iter(node.output), ""), attr.t, where
                )
            elif kind == onnx.AttributeProto.TENSORS:
                for tensor in attr.tensors:
                    _check_tensor(tensor.name or node.name, tensor, where)
            elif kind == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g, where)
            elif kind == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub, where)


def _check_nodes(nodes: Iterable[onnx.NodeProto], where: str) -> None:
    """The tensors a function's nodes hold."""
    for node in nodes:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _check_tensor(attr.t.name or node.name, attr.t, where)
            elif attr.type == onnx.AttributeProto.TENSORS:
                for tensor in attr.tensors:
                    _check_tensor(tensor.name or node.name, tensor, where)
