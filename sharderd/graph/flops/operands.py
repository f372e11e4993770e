"""What a FLOPs rule reads off a node: operand shapes by position, attributes, broadcasting.

Every rule gets the same (node, input shapes, output shapes) triple; these readers keep the
"absent, unknown or out of range" cases in one place so a rule can just return None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx

Shape = tuple[int, ...]
Shapes = Sequence[Shape | None]
Rule = Callable[[onnx.NodeProto, Shapes, Shapes], float | None]
"""FLOPs from (node, input shapes, output shapes); None when a shape the formula needs is unknown."""


def numel(shape: Shape) -> int:
    return math.prod(shape)


def shape_at(shapes: Shapes, k: int) -> Shape | None:
    return shapes[k] if k < len(shapes) else None


def has_input(node: onnx.NodeProto, k: int) -> bool:
    """An optional input is present when named; its shape may still be unknown."""
    return k < len(node.input) and node.input[k] != ""


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    a = _attr(node, name)
    return default if a is None else int(a.i)


def str_attr(node: onnx.NodeProto, name: str, default: str) -> str:
    a = _attr(node, name)
    return default if a is None else a.s.decode()


def ints_attr(node: onnx.NodeProto, name: str) -> tuple[int, ...]:
    a = _attr(node, name)
    return () if a is None else tuple(a.ints)


def broadcast(*shapes: Shape) -> Shape | None:
    """Numpy-style broadcast of ``shapes``; None when they are incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)
