"""PopART's per-op matmul serialization as written in a model: ``__serialize_matmul_mode`` (STRING)
and ``__serialize_matmul_factor`` (INT) on a MatMul node (``plan.probe`` decides which).

Set by node name, in If/Loop/Scan bodies too; a converter that rebuilds the graph loses them, so
the PopRT backend reads them before its conversion and puts them back by name after it, as it
does the stage annotations and ``__available_memory``.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from sharderd.plan.probe import SERIAL_MODE, SERIAL_OPS
from sharderd.shard.amp import walk_nodes
from sharderd.shard.annotate import replace_attributes

__all__ = ["FACTOR_ATTR", "MODE_ATTR", "node_serialization", "set_serialization"]

MODE_ATTR = "__serialize_matmul_mode"
FACTOR_ATTR = "__serialize_matmul_factor"


def set_serialization(model: onnx.ModelProto | onnx.GraphProto, factors: Mapping[str, int]) -> int:
    """Give each MatMul named in ``factors`` ``SERIAL_MODE`` and its factor (replacing any it had);
    names of other ops or of no node are left alone. Returns how many nodes were set."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    count = 0
    for node in walk_nodes(graph):
        if node.name not in factors or node.op_type not in SERIAL_OPS:
            continue
        replace_attributes(
            node,
            onnx.helper.make_attribute(MODE_ATTR, SERIAL_MODE),
            onnx.helper.make_attribute(FACTOR_ATTR, int(factors[node.name])),
        )
        count += 1
    return count


def node_serialization(graph: onnx.GraphProto) -> dict[str, int]:
    """Node name → its ``__serialize_matmul_factor``, for every node (bodies included) whose
    ``__serialize_matmul_mode`` is not ``none``."""
    out: dict[str, int] = {}
    for node in walk_nodes(graph):
        attrs = {a.name: a for a in node.attribute}
        mode, factor = attrs.get(MODE_ATTR), attrs.get(FACTOR_ATTR)
        if mode is None or factor is None or mode.s.decode() == "none":
            continue
        out[node.name] = int(factor.i)
    return out
