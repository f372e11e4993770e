"""Rule factories for ops that cost a fixed amount per element of an input or the output.

Most of the table is one of these with a cost from ``unit_costs``; data movement costs zero here
because the cost model charges bandwidth apart.
"""

from __future__ import annotations

import onnx

from sharderd.graph.flops.operands import Rule, Shapes, broadcast, has_input, numel, shape_at
from sharderd.graph.flops.unit_costs import ARITH


def zero(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float:
    """Pure data movement and control flow: no arithmetic of their own."""
    return 0.0


def elementwise(cost: float) -> Rule:
    """``cost`` per output element; the output shape may be recovered by broadcasting the inputs."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        y = shape_at(outs, 0)
        present = [shape_at(ins, k) for k in range(len(node.input)) if has_input(node, k)]
        if y is None and present and all(s is not None for s in present):
            y = broadcast(*(s for s in present if s is not None))
        return None if y is None else cost * numel(y)

    return rule


def per_output(cost: float) -> Rule:
    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        y = shape_at(outs, 0)
        return None if y is None else cost * numel(y)

    return rule


def per_input(cost: float, optional: tuple[int, ...] = ()) -> Rule:
    """``cost`` per element of input 0, plus one op per element for each optional input present."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        x = shape_at(ins, 0)
        extra = sum(ARITH for k in optional if has_input(node, k))
        return None if x is None else (cost + extra) * numel(x)

    return rule


def variadic(extra: float) -> Rule:
    """Sum/Max/Min/Mean fold n inputs with n-1 binary ops per element (Mean divides once more)."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        per_element = max(1, len(node.input) - 1) * ARITH + extra
        return elementwise(per_element)(node, ins, outs)

    return rule
