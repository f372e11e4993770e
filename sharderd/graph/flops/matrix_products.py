"""FLOPs of the dot-product ops: MatMul and Gemm (plain and quantised), Conv, ConvTranspose, Einsum.

One multiply-accumulate counts 2; these dominate a transformer's or a CNN's compute, so they get
exact formulas rather than a per-element guess.
"""

from __future__ import annotations

import onnx

from sharderd.graph.flops.operands import (
    Rule,
    Shape,
    Shapes,
    broadcast,
    has_input,
    int_attr,
    numel,
    shape_at,
    str_attr,
)
from sharderd.graph.flops.unit_costs import ARITH, DEQUANTIZE


def _matmul_flops(a: Shape | None, b: Shape | None) -> float | None:
    """2·K per output element; 1-D operands follow numpy (promoted, then the dim dropped)."""
    if not a or not b:
        return None
    batch = broadcast(a[:-2], b[:-2])
    if batch is None:
        return None
    y = (*batch, *a[-2:-1], *(b[-1:] if len(b) > 1 else ()))
    return 2.0 * a[-1] * numel(y)


def _swap_last(shape: Shape | None, swap: bool) -> Shape | None:
    return (*shape[:-2], shape[-1], shape[-2]) if swap and shape and len(shape) > 1 else shape


def matmul(a_idx: int, b_idx: int, per_output: float = 0.0) -> Rule:
    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        a = _swap_last(shape_at(ins, a_idx), int_attr(node, "transA", 0) == 1)
        b = _swap_last(shape_at(ins, b_idx), int_attr(node, "transB", 0) == 1)
        flops, y = _matmul_flops(a, b), shape_at(outs, 0)
        if not per_output or flops is None:
            return flops
        return None if y is None else flops + per_output * numel(y)

    return rule


def gemm(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    a, b = shape_at(ins, 0), shape_at(ins, 1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    m, k = a[::-1] if int_attr(node, "transA", 0) else a
    n = b[0] if int_attr(node, "transB", 0) else b[1]
    return 2.0 * m * n * k + (m * n * ARITH if has_input(node, 2) else 0.0)


def matmul_nbits(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """4-bit weights: the MatMul plus dequantising the N×K weights once per call."""
    y, k, n = shape_at(outs, 0), int_attr(node, "K", 0), int_attr(node, "N", 0)
    return None if y is None or not k else 2.0 * k * numel(y) + DEQUANTIZE * k * n


def conv(w_idx: int, bias_idx: int | None, per_output: float = 0.0) -> Rule:
    """Each output element is a dot product over C/group × kernel taps (dilation changes nothing)."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        w, y = shape_at(ins, w_idx), shape_at(outs, 0)
        if w is None or y is None or len(w) < 2:
            return None
        bias = ARITH if bias_idx is not None and has_input(node, bias_idx) else 0.0
        return (2.0 * numel(w[1:]) + bias + per_output) * numel(y)

    return rule


def conv_transpose(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """Each input element scatters into M/group × kernel outputs, W being [C, M/group, k...]."""
    x, w, y = shape_at(ins, 0), shape_at(ins, 1), shape_at(outs, 0)
    if x is None or w is None or len(w) < 2:
        return None
    if not has_input(node, 2):
        return 2.0 * numel(x) * numel(w[1:])
    return None if y is None else 2.0 * numel(x) * numel(w[1:]) + ARITH * numel(y)


def einsum(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """The naive loop nest: product of all index sizes × (operands-1 multiplies + 1 add if summing)."""
    lhs, arrow, rhs = str_attr(node, "equation", "").replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins):
        return None
    sizes: dict[str, int] = {}
    ellipsis: Shape | None = ()
    for term, shape in zip(terms, ins, strict=True):
        head, dots, tail = term.partition("...")
        letters = head + tail
        if shape is None or not all(c.isalpha() for c in letters) or "." in tail:
            return None
        n_dots = len(shape) - len(letters)
        if n_dots < 0 or (n_dots and not dots) or ellipsis is None:
            return None
        ellipsis = broadcast(ellipsis, shape[len(head) : len(head) + n_dots])
        for c, d in zip(letters, shape[: len(head)] + shape[len(shape) - len(tail) :], strict=True):
            sizes[c] = max(sizes.get(c, 1), d)
    if ellipsis is None:
        return None
    if arrow:
        kept, sums_dots = set(rhs.replace("...", "")), "..." in lhs and "..." not in rhs
    else:
        kept, sums_dots = {c for c in sizes if lhs.count(c) == 1}, False
    summing = bool(set(sizes) - kept) or sums_dots
    per_point = (len(terms) - 1) * ARITH + (ARITH if summing else 0.0)
    return per_point * numel(tuple(sizes.values())) * numel(ellipsis)
