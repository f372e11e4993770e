"""FLOPs of window, resampling and addressing ops: pooling, Resize, TopK, Scatter.

Their cost depends on an attribute (kernel, mode, k, reduction) rather than on the element count alone.
"""

from __future__ import annotations

import math

import onnx

from sharderd.graph.flops.operands import Shapes, int_attr, ints_attr, numel, shape_at, str_attr
from sharderd.graph.flops.unit_costs import ARITH


def pool(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    y, kernel = shape_at(outs, 0), ints_attr(node, "kernel_shape")
    return None if y is None or not kernel else float(numel(kernel) * numel(y))


def resize(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """Nearest: one index computation per output; (bi)linear/cubic: a MAC per tap, taps^dims."""
    x, y = shape_at(ins, 0), shape_at(outs, 0)
    taps = {"nearest": 0, "linear": 2, "bilinear": 2, "cubic": 4}.get(
        str_attr(node, "mode", "nearest")
    )
    if y is None or taps is None:
        return None
    if x is not None and len(x) == len(y):
        dims = sum(a != b for a, b in zip(x, y, strict=True))
    else:
        dims = max(len(y) - 2, 1)
    per_output = ARITH if taps == 0 else 2.0 * taps**dims
    return per_output * numel(y)


def topk(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """A heap of k per row: log2(k) comparisons per input element (k read off the output shape)."""
    x, y = shape_at(ins, 0), shape_at(outs, 0)
    if x is None:
        return None
    axis = int_attr(node, "axis", -1)
    k = y[axis] if y and -len(y) <= axis < len(y) else 1
    return numel(x) * max(1.0, math.log2(max(k, 1)))


def scatter(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """One addressing op per update, one more when updates are reduced into the data."""
    updates = shape_at(ins, 2)
    per_update = ARITH * (1 if str_attr(node, "reduction", "none") == "none" else 2)
    return None if updates is None else per_update * numel(updates)
