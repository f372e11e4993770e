"""Fake ``poprt.converter``: ``Sharder`` writes ``__ipu_number`` / ``__pipeline_stage``.

Documented algorithm (poprt-facts.md §1): sharding points are sorted topologically; each point
and its not-yet-assigned ancestors (a branch stops at an assigned node) get the point's device
and stage; every node left over gets ``max + 1`` of both. Attributes are INT. The graph helpers
here are shared with ``poprt.compiler``.
"""

from __future__ import annotations

import copy
import json
import os
from collections import deque
from collections.abc import Mapping

import onnx
from onnx import helper

__all__ = ["Converter", "Sharder"]

IPU_ATTR = "__ipu_number"
STAGE_ATTR = "__pipeline_stage"


class Sharder:
    """Manual sharding of an ONNX model by node name (``sharding_info`` may be positional)."""

    def __init__(
        self,
        sharding_info: Mapping[str, int] | None = None,
        pipelining_info: Mapping[str, int] | None = None,
    ) -> None:
        self.sharding_info = dict(sharding_info or {})
        self.pipelining_info = None if pipelining_info is None else dict(pipelining_info)

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Return a sharded copy of ``model``; the input is left as it was."""
        model = copy.deepcopy(model)
        nodes = list(model.graph.node)
        _check_names(nodes)
        by_name = {node.name: i for i, node in enumerate(nodes)}
        unknown = [
            name
            for name in [*self.sharding_info, *(self.pipelining_info or {})]
            if name not in by_name
        ]
        if unknown:
            raise ValueError(f"Sharding point is not a node of the model: {unknown[0]}")
        if self.pipelining_info is not None and set(self.pipelining_info) != set(
            self.sharding_info
        ):
            raise ValueError("pipelining_info must name the same nodes as sharding_info")

        order = topological_order(model.graph)
        rank = {node_index: position for position, node_index in enumerate(order)}
        producers = producer_indices(model.graph)
        device: dict[int, int] = {}
        stage: dict[int, int] = {}
        for point in sorted((by_name[name] for name in self.sharding_info), key=rank.__getitem__):
            name = nodes[point].name
            dev = int(self.sharding_info[name])
            stg = None if self.pipelining_info is None else int(self.pipelining_info[name])
            queue = deque([point])
            while queue:
                index = queue.popleft()
                if index in device:
                    continue
                device[index] = dev
                if stg is not None:
                    stage[index] = stg
                queue.extend(p for p in producers[index] if p not in device)

        last_device = max(device.values(), default=-1) + 1
        last_stage = max(stage.values(), default=-1) + 1
        for index, node in enumerate(nodes):
            _set_int(node, IPU_ATTR, device.get(index, last_device))
            if self.pipelining_info is not None:
                _set_int(node, STAGE_ATTR, stage.get(index, last_stage))
        return model


def _check_names(nodes: list[onnx.NodeProto]) -> None:
    seen: set[str] = set()
    for node in nodes:
        if not node.name:
            raise ValueError(
                f"Each node needs to have a unique name. This node has no name: {node}"
            )
        if node.name in seen:
            raise ValueError(
                f"Each node needs to have a unique name. This node has a duplicate name: {node.name}"
            )
        seen.add(node.name)


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, int(value))])


def producer_indices(graph: onnx.GraphProto) -> list[list[int]]:
    """For each node, the indices of the nodes producing its inputs (graph inputs excluded)."""
    made_by = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    return [
        sorted({made_by[name] for name in node.input if name in made_by}) for node in graph.node
    ]


def topological_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices producers-first, stable on the file order (Kahn's algorithm)."""
    producers = producer_indices(graph)
    consumers: list[list[int]] = [[] for _ in graph.node]
    pending = [len(p) for p in producers]
    for index, inputs in enumerate(producers):
        for producer in inputs:
            consumers[producer].append(index)
    ready = deque(i for i, n in enumerate(pending) if n == 0)
    order: list[int] = []
    while ready:
        index = ready.popleft()
        order.append(index)
        for consumer in consumers[index]:
            pending[consumer] -= 1
            if pending[consumer] == 0:
                ready.append(consumer)
    if len(order) != len(producers):
        raise RuntimeError("The ONNX graph has a cycle")
    return order


def int_attribute(node: onnx.NodeProto, name: str) -> int | None:
    """The INT attribute ``name`` of ``node``; PopART reads these as int64."""
    for attribute in node.attribute:
        if attribute.name == name:
            return int(helper.get_attribute_value(attribute))
    return None


class Converter:
    """PopRT's pre-compile conversion (poprt-facts.md §7): ``Converter(convert_version=11,
    precision='fp16').convert(model) -> ModelProto``.

    Like the real one it rebuilds the graph, so node attributes it does not know (the
    ``__ipu_number`` / ``__pipeline_stage`` annotations) are gone afterwards, which is why PopRT
    applies manual sharding after conversion, by node name. ``FAKE_POPRT_CONVERT_OPS`` (JSON, node
    name → op type) rewrites those nodes' op (a MatMul of 2-D operands as a Gemm), as a
    conversion pass may. ``fp16`` turns float32 initializers
    into float16 (graph inputs and outputs keep their type).
    """

    def __init__(self, convert_version: int = 11, precision: str = "fp32", **_: object) -> None:
        if precision not in ("fp32", "fp16"):
            raise RuntimeError(f"unsupported precision {precision!r}")
        self.convert_version = convert_version
        self.precision = precision

    def convert(self, model: onnx.ModelProto) -> onnx.ModelProto:
        import numpy as np
        from onnx import TensorProto, numpy_helper

        model = copy.deepcopy(model)
        rewritten = json.loads(os.environ.get("FAKE_POPRT_CONVERT_OPS") or "{}")
        for node in model.graph.node:
            kept = [a for a in node.attribute if not a.name.startswith("__")]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.op_type = rewritten.get(node.name, node.op_type)
        if self.precision == "fp16":
            for tensor in model.graph.initializer:
                if (
                    tensor.data_type == TensorProto.FLOAT
                    and tensor.data_location != TensorProto.EXTERNAL
                ):
                    half = numpy_helper.to_array(tensor).astype(np.float16)
                    tensor.CopyFrom(numpy_helper.from_array(half, tensor.name))
        return model
