"""Fake ``poprt.Pass``: passes looked up by name, each ``Pass.get_pass(name)(model) -> model``.

``int64_to_int32`` (poprt-facts.md §7: "int64 inputs become int32 after conversion"): int64 graph
inputs become int32, each followed by a new ``Cast`` back to int64 for its readers (the new
nodes carry no sharding attributes, as a real pass's would not). Initializers are left as they
are (the fake compiler's memory truth does not look at index dtypes). Unknown names raise
``RuntimeError`` as PopRT does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import ClassVar

import onnx
from onnx import TensorProto, helper

__all__ = ["Pass"]


class Pass:
    _registry: ClassVar[dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]]] = {}

    @classmethod
    def get_pass(cls, name: str) -> Callable[[onnx.ModelProto], onnx.ModelProto]:
        try:
            return cls._registry[name]
        except KeyError:
            raise RuntimeError(f"Pass {name} is not registered") from None


def _int64_to_int32(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    graph = model.graph
    casts: list[onnx.NodeProto] = []
    for value in graph.input:
        if value.type.tensor_type.elem_type == TensorProto.INT64:
            value.type.tensor_type.elem_type = TensorProto.INT32
            casts.append(_cast_after(graph, value.name, f"{value.name}__int32_cast"))
    for node in reversed(casts):
        graph.node.insert(0, node)
    return model


def _cast_after(graph: onnx.GraphProto, name: str, node_name: str) -> onnx.NodeProto:
    """Readers of ``name`` read an int64 Cast of it instead."""
    out = f"{name}__as_int64"
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x == name:
                node.input[i] = out
    return helper.make_node("Cast", [name], [out], name=node_name, to=TensorProto.INT64)


Pass._registry["int64_to_int32"] = _int64_to_int32
