"""Where a size stays unknown, the node that stops it and why, for the report.

A stop is a top-level node some of whose outputs have no static size although every input it reads
has one: everything unknown downstream is unknown because of it. Its reason is read off the node
(custom domain, control flow, a size that depends on the data) or off its inputs (an input whose
value decides the size and is not a compile-time constant).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import onnx

from sharderd.graph.evaluate import VALUE_BYTES
from sharderd.graph.shape_types import TensorType

__all__ = ["ShapeStop", "shape_stops"]

_DATA_DEPENDENT = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression", "TopK"})
_VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Pad": (1, 2, 3),
    "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "OneHot": (1,),
    "CenterCropPad": (1,),
}
"""Inputs whose values (not only sizes) decide an op's output size."""


@dataclass(frozen=True, slots=True)
class ShapeStop:
    node: str
    op_type: str
    why: str
    unknown_outputs: tuple[str, ...]


def shape_stops(
    graph: onnx.GraphProto,
    order: Sequence[int],
    types: Mapping[str, TensorType],
    constants: Collection[str],
) -> tuple[ShapeStop, ...]:
    """Every node at which sizes stop being known, in topological order; ``constants`` are the
    tensors whose values are known (small initializers, evaluated constant expressions)."""
    stops = []
    for i in order:
        node = graph.node[i]
        unknown = tuple(o for o in node.output if o and _unknown(types, o))
        if not unknown or any(_unknown(types, name) for name in node.input if name):
            continue
        stops.append(ShapeStop(node.name or f"#{i}", node.op_type, _why(node, constants), unknown))
    return tuple(stops)


def _unknown(types: Mapping[str, TensorType], name: str) -> bool:
    tt = types.get(name)
    return tt is None or tt.shape is None


def _why(node: onnx.NodeProto, constants: Collection[str]) -> str:
    if node.domain not in ("", "ai.onnx"):
        return f"custom op {node.domain}::{node.op_type}: no shape inference knows its output size"
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return "control flow: inference left the outputs of its bodies untyped"
    for slot in _VALUE_INPUTS.get(node.op_type, ()):
        if slot < len(node.input) and node.input[slot] and node.input[slot] not in constants:
            return (
                f"its output size depends on the value of input {node.input[slot]!r}, which is not "
                f"a compile-time constant (it is computed from the data, or is over {VALUE_BYTES} bytes)"
            )
    if node.op_type in _DATA_DEPENDENT:
        return f"{node.op_type}'s output size depends on the data and has no bound here"
    return "inference cannot size its output from its inputs' sizes"
