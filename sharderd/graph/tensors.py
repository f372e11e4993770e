"""Tensor sizes from type information alone: weights are never read to be measured."""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
from onnx import TensorProto

__all__ = [
    "BITS_PER_ELEMENT",
    "all_tensors",
    "node_tensors",
    "shape_bytes",
    "tensor_nbytes",
    "tensor_numel",
]

BITS_PER_ELEMENT: dict[int, int] = {
    TensorProto.FLOAT: 32,
    TensorProto.UINT8: 8,
    TensorProto.INT8: 8,
    TensorProto.UINT16: 16,
    TensorProto.INT16: 16,
    TensorProto.INT32: 32,
    TensorProto.INT64: 64,
    TensorProto.STRING: 64,  # a pointer-sized guess; strings never reach an accelerator
    TensorProto.BOOL: 8,
    TensorProto.FLOAT16: 16,
    TensorProto.DOUBLE: 64,
    TensorProto.UINT32: 32,
    TensorProto.UINT64: 64,
    TensorProto.COMPLEX64: 64,
    TensorProto.COMPLEX128: 128,
    TensorProto.BFLOAT16: 16,
    TensorProto.FLOAT8E4M3FN: 8,
    TensorProto.FLOAT8E4M3FNUZ: 8,
    TensorProto.FLOAT8E5M2: 8,
    TensorProto.FLOAT8E5M2FNUZ: 8,
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
}
for _name in ("FLOAT8E8M0", "UINT2", "INT2"):
    if hasattr(TensorProto, _name):
        BITS_PER_ELEMENT[getattr(TensorProto, _name)] = 2 if _name.endswith("2") else 8


def shape_bytes(shape: tuple[int, ...], elem_type: int) -> int:
    """Bytes of a dense tensor; sub-byte types round up to whole bytes."""
    bits = BITS_PER_ELEMENT.get(elem_type, 32)
    return (math.prod(shape) * bits + 7) // 8


def tensor_numel(tensor: onnx.TensorProto) -> int:
    return math.prod(tensor.dims)


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Size from dims × dtype, whether the data is inline, external or absent."""
    if any(d < 0 for d in tensor.dims):
        from sharderd.errors import ModelInvalidError

        raise ModelInvalidError(f"tensor {tensor.name!r} has a negative dim {list(tensor.dims)}")
    return shape_bytes(tuple(tensor.dims), tensor.data_type)


def all_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every TensorProto a graph holds: initializers, Constant/attribute tensors, nested bodies.

    Yields ``(owner, tensor)``; ``owner`` names the node for attribute tensors so that error
    messages can point at something a user can find.
    """
    for tensor in graph.initializer:
        yield tensor.name, tensor
    for sparse in graph.sparse_initializer:
        yield sparse.values.name, sparse.values
    yield from node_tensors(graph)


def node_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """The tensors of ``all_tensors`` that nodes hold (Constant/attribute values, whole bodies),
    without the graph's own initializers."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t.name or node.name or node.output[0], attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                for tensor in attr.tensors:
                    yield tensor.name or node.name, tensor
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_tensors(sub)
