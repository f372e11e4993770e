"""Per-node costs: FLOPs, weight bytes (by weight id, so sharing is visible) and activation bytes.

Arrays are indexed like ``Dataflow``: ``flops[node]``, ``tensor_bytes[tensor]``. Tensors whose
shape stays unknown cost 0 bytes and are listed, so the report can say what the plan ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.numpy_helper

from sharderd.errors import ModelInvalidError
from sharderd.graph.dataflow import Dataflow
from sharderd.graph.flops import node_flops
from sharderd.graph.shapes import TensorType
from sharderd.graph.tensors import shape_bytes

__all__ = ["MAX_TENSOR_BYTES", "GraphCosts", "compute_costs", "node_flops_of", "scalar_constants"]

MAX_TENSOR_BYTES = 2**50
"""A petabyte: anything larger is a corrupt or hostile shape, not a model."""


@dataclass(frozen=True, slots=True)
class GraphCosts:
    flops: np.ndarray
    """float64 [N]: FLOPs of one inference of each top-level node (bodies included)."""
    tensor_bytes: np.ndarray
    """int64 [T]: bytes of each activation tensor (0 when unknown)."""
    unknown_tensors: tuple[str, ...]
    default_cost_ops: Mapping[str, int]
    """Op types costed with the default rule, and how many nodes each."""
    control_flow_notes: tuple[str, ...]


def compute_costs(
    graph: onnx.GraphProto, flow: Dataflow, types: Mapping[str, TensorType]
) -> GraphCosts:
    tensor_bytes = np.zeros(flow.num_tensors, dtype=np.int64)
    unknown: list[str] = []
    for t, name in enumerate(flow.tensor_names):
        tt = types.get(name)
        if tt is None or tt.shape is None:
            unknown.append(name)
        else:
            size = shape_bytes(tt.shape, tt.elem_type)
            if size > MAX_TENSOR_BYTES:
                raise ModelInvalidError(
                    f"tensor {name!r} declares {size} bytes (shape {list(tt.shape)}): absurd dims"
                )
            tensor_bytes[t] = size
    coster = _Coster(types, scalar_constants(graph))
    flops = np.fromiter(
        (coster.node(node) for node in graph.node), dtype=np.float64, count=len(graph.node)
    )
    return GraphCosts(flops, tensor_bytes, tuple(unknown), coster.defaults, tuple(coster.notes))


def node_flops_of(
    nodes: Sequence[onnx.NodeProto], types: Mapping[str, TensorType]
) -> tuple[np.ndarray, dict[str, int]]:
    """FLOPs of ``nodes`` as ``compute_costs`` counts them (no Loop trip counts known), and the op
    types among them costed with the default rule."""
    coster = _Coster(types, {})
    flops = np.fromiter((coster.node(n) for n in nodes), dtype=np.float64, count=len(nodes))
    return flops, coster.defaults


def _shape(types: Mapping[str, TensorType], name: str) -> tuple[int, ...] | None:
    if not name:
        return None
    tt = types.get(name)
    return None if tt is None else tt.shape


class _Coster:
    """Costs nodes (bodies included) against one shape table, collecting what fell back to defaults."""

    __slots__ = ("defaults", "notes", "scalars", "types")

    def __init__(self, types: Mapping[str, TensorType], scalars: Mapping[str, int]) -> None:
        self.types = types
        self.scalars = scalars
        self.defaults: dict[str, int] = {}
        self.notes: list[str] = []

    def node(self, node: onnx.NodeProto) -> float:
        estimate = node_flops(
            node,
            [_shape(self.types, name) for name in node.input],
            [_shape(self.types, name) for name in node.output],
        )
        if not estimate.known:
            key = (
                f"{node.domain}::{node.op_type}"
                if node.domain not in ("", "ai.onnx")
                else node.op_type
            )
            self.defaults[key] = self.defaults.get(key, 0) + 1
        return estimate.flops + self.bodies(node)

    def bodies(self, node: onnx.NodeProto) -> float:
        """If: the dearer branch; Loop: body × trip count; Scan: body × sequence length."""
        bodies = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        if not bodies:
            return 0.0
        costs = {
            name: sum(self.node(inner) for inner in body.node) for name, body in bodies.items()
        }
        if node.op_type == "If":
            return max(costs.values())
        if node.op_type == "Loop":
            trips = self.scalars.get(node.input[0]) if node.input and node.input[0] else None
            if trips is None:
                self.notes.append(f"Loop {node.name!r}: trip count unknown, body counted once")
                trips = 1
            return costs.get("body", 0.0) * trips
        if node.op_type == "Scan":
            length = _scan_length(node, self.types)
            if length is None:
                self.notes.append(f"Scan {node.name!r}: sequence length unknown, body counted once")
                length = 1
            return costs.get("body", 0.0) * length
        return sum(costs.values())


def scalar_constants(graph: onnx.GraphProto) -> dict[str, int]:
    """Inline integer scalars (Loop trip counts): the only weight values the engine ever reads."""
    found: dict[str, int] = {}
    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [
        (node.output[0], a.t)
        for node in graph.node
        if node.op_type == "Constant" and node.output
        for a in node.attribute
        if a.type == onnx.AttributeProto.TENSOR
    ]
    for name, tensor in tensors:
        if (
            int(np.prod(tensor.dims)) == 1
            and tensor.data_location != onnx.TensorProto.EXTERNAL
            and tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        ):
            try:
                found[name] = int(onnx.numpy_helper.to_array(tensor).reshape(()))
            except ValueError:
                raise ModelInvalidError(
                    f"tensor {name!r} is declared as an integer scalar but holds no valid data"
                ) from None
    return found


def _scan_length(node: onnx.NodeProto, types: Mapping[str, TensorType]) -> int | None:
    num_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    if num_scan <= 0:
        return None
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
    state = len(node.input) - num_scan
    shape = _shape(types, node.input[state])
    if shape is None:
        return None
    axis = axes[0] if axes else 0
    return shape[axis] if -len(shape) <= axis < len(shape) else None
