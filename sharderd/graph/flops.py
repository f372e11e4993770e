"""FLOPs of one ONNX node from its static shapes: the compute half of the cost model.

The planner balances stages by compute, so every node needs a number, even an op nobody taught us:
those get ``DEFAULT_FLOPS_PER_OUTPUT_ELEMENT`` per output element and ``known=False`` so callers can
say how much of a plan rests on guesses. One multiply-accumulate counts as 2 FLOPs; a transcendental
(exp, log, tanh, erf...) as 4, because it costs several ALU ops on every device we target. Counts
are estimates to balance stages with, not profiles: ``docs/flops.md`` lists every formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

__all__ = ["DEFAULT_FLOPS_PER_OUTPUT_ELEMENT", "FlopsEstimate", "Shape", "node_flops"]

Shape = tuple[int, ...]
Shapes = Sequence[Shape | None]
_Rule = Callable[[onnx.NodeProto, Shapes, Shapes], float | None]
"""FLOPs from (node, input shapes, output shapes); None when a shape the formula needs is unknown."""

DEFAULT_FLOPS_PER_OUTPUT_ELEMENT: float = 1.0
"""An op outside the table is assumed to do one FLOP per output element: cheap, but never free."""

_ARITH = 1.0  # add, multiply, compare, select, cast, piecewise-linear activation
_TRANSCENDENTAL = 4.0  # exp, log, tanh, erf, sin, pow...
_SOFTMAX = 4 * _ARITH + _TRANSCENDENTAL  # max, subtract, exp, sum, divide
_GELU = _TRANSCENDENTAL + 4 * _ARITH  # x * 0.5 * (1 + erf(x / sqrt 2))
_QUANTIZE = 4 * _ARITH  # divide, round, add zero point, saturate
_DEQUANTIZE = 2 * _ARITH  # subtract zero point, multiply
_MS = "com.microsoft"


@dataclass(frozen=True, slots=True)
class FlopsEstimate:
    """FLOPs of one node, and whether they came from the op's own formula."""

    flops: float
    known: bool
    """False when the op is not in the table or a needed shape is unknown: the default was used."""


def node_flops(
    node: onnx.NodeProto, in_shapes: Sequence[Shape | None], out_shapes: Sequence[Shape | None]
) -> FlopsEstimate:
    """FLOPs of ``node``; ``in_shapes[k]`` is the static shape of ``node.input[k]`` (None: unknown).

    Control flow (If/Loop/Scan) counts 0 here: the caller adds what its bodies cost.
    """
    ins = [_clean(s) for s in in_shapes]
    outs = [_clean(s) for s in out_shapes]
    domain = "" if node.domain == "ai.onnx" else node.domain
    rule = _RULES.get((domain, node.op_type))
    if rule is not None:
        try:
            flops = rule(node, ins, outs)
        except (IndexError, ValueError):  # a rank the op does not allow: the validator's business
            flops = None
        if flops is not None:
            return FlopsEstimate(float(flops), True)
    known_outs = [_numel(s) for s in outs if s is not None]
    return FlopsEstimate(float(sum(known_outs)) * DEFAULT_FLOPS_PER_OUTPUT_ELEMENT, False)


# --- helpers -----------------------------------------------------------------------------------


def _clean(shape: Sequence[int] | None) -> Shape | None:
    """A shape with a negative (unresolved) dim is as good as unknown."""
    if shape is None or any(int(d) < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _at(shapes: Shapes, k: int) -> Shape | None:
    return shapes[k] if k < len(shapes) else None


def _has_input(node: onnx.NodeProto, k: int) -> bool:
    """An optional input is present when named; its shape may still be unknown."""
    return k < len(node.input) and node.input[k] != ""


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _int(node: onnx.NodeProto, name: str, default: int) -> int:
    a = _attr(node, name)
    return default if a is None else int(a.i)


def _str(node: onnx.NodeProto, name: str, default: str) -> str:
    a = _attr(node, name)
    return default if a is None else a.s.decode()


def _ints(node: onnx.NodeProto, name: str) -> tuple[int, ...]:
    a = _attr(node, name)
    return () if a is None else tuple(a.ints)


def _broadcast(*shapes: Shape) -> Shape | None:
    """Numpy-style broadcast of ``shapes``; None when they are incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# --- rule factories ----------------------------------------------------------------------------


def _zero(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float:
    """Pure data movement and control flow: no arithmetic of their own."""
    return 0.0


def _elementwise(cost: float) -> _Rule:
    """``cost`` per output element; the output shape may be recovered by broadcasting the inputs."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        y = _at(outs, 0)
        present = [_at(ins, k) for k in range(len(node.input)) if _has_input(node, k)]
        if y is None and present and all(s is not None for s in present):
            y = _broadcast(*(s for s in present if s is not None))
        return None if y is None else cost * _numel(y)

    return rule


def _per_output(cost: float) -> _Rule:
    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        y = _at(outs, 0)
        return None if y is None else cost * _numel(y)

    return rule


def _per_input(cost: float, optional: tuple[int, ...] = ()) -> _Rule:
    """``cost`` per element of input 0, plus one op per element for each optional input present."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        x = _at(ins, 0)
        extra = sum(_ARITH for k in optional if _has_input(node, k))
        return None if x is None else (cost + extra) * _numel(x)

    return rule


def _variadic(extra: float) -> _Rule:
    """Sum/Max/Min/Mean fold n inputs with n-1 binary ops per element (Mean divides once more)."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        per_element = max(1, len(node.input) - 1) * _ARITH + extra
        return _elementwise(per_element)(node, ins, outs)

    return rule


# --- matrix products ---------------------------------------------------------------------------


def _matmul_flops(a: Shape | None, b: Shape | None) -> float | None:
    """2·K per output element; 1-D operands follow numpy (promoted, then the dim dropped)."""
    if not a or not b:
        return None
    batch = _broadcast(a[:-2], b[:-2])
    if batch is None:
        return None
    y = (*batch, *a[-2:-1], *(b[-1:] if len(b) > 1 else ()))
    return 2.0 * a[-1] * _numel(y)


def _swap_last(shape: Shape | None, swap: bool) -> Shape | None:
    return (*shape[:-2], shape[-1], shape[-2]) if swap and shape and len(shape) > 1 else shape


def _matmul(a_idx: int, b_idx: int, per_output: float = 0.0) -> _Rule:
    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        a = _swap_last(_at(ins, a_idx), _int(node, "transA", 0) == 1)
        b = _swap_last(_at(ins, b_idx), _int(node, "transB", 0) == 1)
        flops, y = _matmul_flops(a, b), _at(outs, 0)
        if not per_output or flops is None:
            return flops
        return None if y is None else flops + per_output * _numel(y)

    return rule


def _gemm(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    a, b = _at(ins, 0), _at(ins, 1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    m, k = a[::-1] if _int(node, "transA", 0) else a
    n = b[0] if _int(node, "transB", 0) else b[1]
    return 2.0 * m * n * k + (m * n * _ARITH if _has_input(node, 2) else 0.0)


def _matmul_nbits(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """4-bit weights: the MatMul plus dequantising the N×K weights once per call."""
    y, k, n = _at(outs, 0), _int(node, "K", 0), _int(node, "N", 0)
    return None if y is None or not k else 2.0 * k * _numel(y) + _DEQUANTIZE * k * n


def _conv(w_idx: int, bias_idx: int | None, per_output: float = 0.0) -> _Rule:
    """Each output element is a dot product over C/group × kernel taps (dilation changes nothing)."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        w, y = _at(ins, w_idx), _at(outs, 0)
        if w is None or y is None or len(w) < 2:
            return None
        bias = _ARITH if bias_idx is not None and _has_input(node, bias_idx) else 0.0
        return (2.0 * _numel(w[1:]) + bias + per_output) * _numel(y)

    return rule


def _conv_transpose(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """Each input element scatters into M/group × kernel outputs, W being [C, M/group, k...]."""
    x, w, y = _at(ins, 0), _at(ins, 1), _at(outs, 0)
    if x is None or w is None or len(w) < 2:
        return None
    if not _has_input(node, 2):
        return 2.0 * _numel(x) * _numel(w[1:])
    return None if y is None else 2.0 * _numel(x) * _numel(w[1:]) + _ARITH * _numel(y)


def _einsum(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """The naive loop nest: product of all index sizes × (operands-1 multiplies + 1 add if summing)."""
    lhs, arrow, rhs = _str(node, "equation", "").replace(" ", "").partition("->")
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
        ellipsis = _broadcast(ellipsis, shape[len(head) : len(head) + n_dots])
        for c, d in zip(letters, shape[: len(head)] + shape[len(shape) - len(tail) :], strict=True):
            sizes[c] = max(sizes.get(c, 1), d)
    if ellipsis is None:
        return None
    if arrow:
        kept, sums_dots = set(rhs.replace("...", "")), "..." in lhs and "..." not in rhs
    else:
        kept, sums_dots = {c for c in sizes if lhs.count(c) == 1}, False
    summing = bool(set(sizes) - kept) or sums_dots
    per_point = (len(terms) - 1) * _ARITH + (_ARITH if summing else 0.0)
    return per_point * _numel(tuple(sizes.values())) * _numel(ellipsis)


# --- attention ---------------------------------------------------------------------------------


def _attention_core(b: int, heads: int, sq: int, skv: int, d: int, dv: int) -> float:
    """QKᵀ (2·d per score), scale + softmax per score, then AV (2·dv per score)."""
    return float(b * heads * sq * skv) * (2 * d + 2 * dv + _ARITH + _SOFTMAX)


def _attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """ONNX Attention (opset 23): Q/K/V as 4-D [B, H, S, D] or 3-D [B, S, H·D] with head attrs."""
    q, k, v, past = _at(ins, 0), _at(ins, 1), _at(ins, 2), _at(ins, 4)
    if q is None or k is None or v is None or len(k) < 3:
        return None
    if len(q) == 4 and len(v) == 4:
        b, heads, sq, d = q
        dv = v[3]
    else:
        heads, kv_heads = _int(node, "q_num_heads", 0), _int(node, "kv_num_heads", 0)
        if len(q) != 3 or len(v) != 3 or not heads or not kv_heads:
            return None
        b, sq, d, dv = q[0], q[1], q[2] // heads, v[2] // kv_heads
    skv = k[-2] + (past[2] if past is not None and len(past) == 4 else 0)
    return _attention_core(b, heads, sq, skv, d, dv)


def _ms_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft Attention: the fused QKV projection [B,S,in]×[in, q+k+v], then the core."""
    x, w, past = _at(ins, 0), _at(ins, 1), _at(ins, 4)
    heads = _int(node, "num_heads", 0)
    if x is None or w is None or len(x) != 3 or len(w) != 2 or not heads:
        return None
    b, s, hidden_in = x
    sizes = _ints(node, "qkv_hidden_sizes") or (w[1] // 3,) * 3
    if len(sizes) != 3:
        return None
    q_size, _, v_size = sizes
    projection = 2.0 * b * s * hidden_in * w[1] + (b * s * w[1] if _has_input(node, 2) else 0)
    skv = s + (past[3] if past is not None and len(past) == 5 else 0)
    return projection + _attention_core(b, heads, s, skv, q_size // heads, v_size // heads)


def _ms_multi_head_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft MultiHeadAttention, including packed QKV [B,S,H,3,D] and KV [B,S,H,2,D]."""
    q, k, v, past = _at(ins, 0), _at(ins, 1), _at(ins, 2), _at(ins, 6)
    heads = _int(node, "num_heads", 0)
    if q is None or not heads:
        return None
    if len(q) == 5:
        b, sq, _, _, d = q
        return _attention_core(b, heads, sq, sq, d, d)
    if len(q) != 3 or k is None or len(k) not in (3, 4, 5):
        return None
    b, sq, d = q[0], q[1], q[2] // heads
    if len(k) == 5:  # packed KV
        skv, dv = k[1], k[4]
    else:  # [B, S, H·D] or, for cross attention with a cache, [B, H, S, D]
        skv = k[-2]
        dv = d if v is None else v[-1] // heads if len(v) == 3 else v[-1]
    if len(k) == 3 and past is not None and len(past) == 4:
        skv += past[2]
    return _attention_core(b, heads, sq, skv, d, dv)


def _ms_group_query_attention(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """com.microsoft GroupQueryAttention: K/V heads shared; the KV length is the present cache's."""
    q, present, past = _at(ins, 0), _at(outs, 1), _at(ins, 3)
    heads, kv_heads = _int(node, "num_heads", 0), _int(node, "kv_num_heads", 0)
    if q is None or len(q) != 3 or not heads or not kv_heads:
        return None
    d = q[2] // heads if _has_input(node, 1) else q[2] // (heads + 2 * kv_heads)
    if present is not None and len(present) == 4:
        skv = present[2]
    else:
        skv = q[1] + (past[2] if past is not None and len(past) == 4 else 0)
    return _attention_core(q[0], heads, q[1], skv, d, d)


# --- recurrent ---------------------------------------------------------------------------------


def _recurrent(gates: int, transcendental: int, arith: int) -> _Rule:
    """Per time step and direction: [x, h] × all gate weights, then the gate math per hidden unit."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        x, w, r = _at(ins, 0), _at(ins, 1), _at(ins, 2)
        if x is None or len(x) != 3:
            return None
        seq, batch = (x[1], x[0]) if _int(node, "layout", 0) else (x[0], x[1])
        hidden = _int(node, "hidden_size", 0) or (r[2] if r is not None and len(r) == 3 else 0)
        if not hidden:
            return None
        inp = w[2] if w is not None and len(w) == 3 else x[2]
        dirs = 2 if _str(node, "direction", "forward") == "bidirectional" else 1
        bias = 2 * gates * _ARITH if _has_input(node, 3) else 0.0
        per_unit = 2.0 * gates * (inp + hidden) + transcendental * _TRANSCENDENTAL + arith * _ARITH
        return float(seq * dirs * batch * hidden) * (per_unit + bias)

    return rule


# --- windows and resampling --------------------------------------------------------------------


def _pool(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    y, kernel = _at(outs, 0), _ints(node, "kernel_shape")
    return None if y is None or not kernel else float(_numel(kernel) * _numel(y))


def _resize(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """Nearest: one index computation per output; (bi)linear/cubic: a MAC per tap, taps^dims."""
    x, y = _at(ins, 0), _at(outs, 0)
    taps = {"nearest": 0, "linear": 2, "bilinear": 2, "cubic": 4}.get(_str(node, "mode", "nearest"))
    if y is None or taps is None:
        return None
    if x is not None and len(x) == len(y):
        dims = sum(a != b for a, b in zip(x, y, strict=True))
    else:
        dims = max(len(y) - 2, 1)
    per_output = _ARITH if taps == 0 else 2.0 * taps**dims
    return per_output * _numel(y)


def _topk(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """A heap of k per row: log2(k) comparisons per input element (k read off the output shape)."""
    x, y = _at(ins, 0), _at(outs, 0)
    if x is None:
        return None
    axis = _int(node, "axis", -1)
    k = y[axis] if y and -len(y) <= axis < len(y) else 1
    return _numel(x) * max(1.0, math.log2(max(k, 1)))


def _scatter(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
    """One addressing op per update, one more when updates are reduced into the data."""
    updates = _at(ins, 2)
    per_update = _ARITH * (1 if _str(node, "reduction", "none") == "none" else 2)
    return None if updates is None else per_update * _numel(updates)


# --- the table ---------------------------------------------------------------------------------


def _each(rule: _Rule, op_types: str, domain: str = "") -> dict[tuple[str, str], _Rule]:
    """One rule for several ops, named as a whitespace-separated list."""
    return {(domain, op): rule for op in op_types.split()}


_RULES: dict[tuple[str, str], _Rule] = {
    # Pure data movement: copies and views cost bandwidth, which the cost model charges apart.
    **_each(
        _zero,
        """Reshape Squeeze Unsqueeze Flatten Identity Shape Size Constant ConstantOfShape Transpose
        Concat Split Slice Pad Expand Tile DepthToSpace SpaceToDepth ReverseSequence EyeLike Dropout
        SplitToSequence ConcatFromSequence SequenceConstruct SequenceAt SequenceInsert SequenceErase
        SequenceLength SequenceEmpty Optional OptionalGetElement OptionalHasElement""",
    ),
    # Control flow: the caller adds the bodies' FLOPs.
    **_each(_zero, "If Loop Scan SequenceMap"),
    **_each(
        _elementwise(_ARITH),
        """Add Sub Mul Div Neg Abs Mod Reciprocal Sqrt Floor Ceil Round Sign Relu LeakyRelu PRelu
        ThresholdedRelu Clip Shrink Where Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor
        Not BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot IsNaN IsInf Cast CastLike""",
    ),
    **_each(
        _elementwise(_TRANSCENDENTAL),
        "Exp Log Pow Tanh Sigmoid Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh",
    ),
    **_each(_elementwise(_TRANSCENDENTAL + 2 * _ARITH), "Elu Selu Celu"),
    ("", "Softplus"): _elementwise(2 * _TRANSCENDENTAL + _ARITH),
    ("", "Mish"): _elementwise(3 * _TRANSCENDENTAL + _ARITH),
    **_each(_elementwise(3 * _ARITH), "Softsign HardSigmoid"),
    ("", "HardSwish"): _elementwise(4 * _ARITH),
    ("", "Swish"): _elementwise(_TRANSCENDENTAL + _ARITH),
    ("", "Gelu"): _elementwise(_GELU),
    **_each(_variadic(0.0), "Sum Max Min"),
    ("", "Mean"): _variadic(_ARITH),
    **_each(
        _per_input(_ARITH),
        """ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceLogSum ArgMax ArgMin Hardmax
        CumSum NonZero GlobalAveragePool GlobalMaxPool GlobalLpPool""",
    ),
    **_each(_per_input(2 * _ARITH), "ReduceL1 ReduceL2 ReduceSumSquare"),
    ("", "ReduceLogSumExp"): _per_input(_ARITH + _TRANSCENDENTAL),
    ("", "MatMul"): _matmul(0, 1),
    ("", "MatMulInteger"): _matmul(0, 1),
    ("", "QLinearMatMul"): _matmul(0, 3, per_output=_QUANTIZE),
    ("", "Gemm"): _gemm,
    ("", "Conv"): _conv(1, 2),
    ("", "ConvInteger"): _conv(1, None),
    ("", "QLinearConv"): _conv(3, 8, per_output=_QUANTIZE),
    ("", "ConvTranspose"): _conv_transpose,
    ("", "Einsum"): _einsum,
    ("", "Attention"): _attention,
    ("", "LSTM"): _recurrent(gates=4, transcendental=5, arith=4),
    ("", "GRU"): _recurrent(gates=3, transcendental=3, arith=5),
    ("", "RNN"): _recurrent(gates=1, transcendental=1, arith=0),
    **_each(
        _per_input(5 * _ARITH, (1, 2)),
        "LayerNormalization InstanceNormalization GroupNormalization",
    ),
    ("", "BatchNormalization"): _per_input(2 * _ARITH, (1, 2)),
    ("", "MeanVarianceNormalization"): _per_input(5 * _ARITH),
    ("", "LpNormalization"): _per_input(3 * _ARITH),
    **_each(_per_input(3 * _ARITH, (1,)), "RMSNormalization SimplifiedLayerNormalization"),
    **_each(_per_input(_SOFTMAX), "Softmax LogSoftmax"),
    **_each(_pool, "MaxPool AveragePool LpPool"),
    **_each(_resize, "Resize Upsample"),
    ("", "TopK"): _topk,
    **_each(_per_output(_ARITH), "Gather GatherElements GatherND Range OneHot Trilu"),
    **_each(_scatter, "ScatterND ScatterElements Scatter"),
    **_each(_per_input(_QUANTIZE), "QuantizeLinear"),
    **_each(_per_input(_DEQUANTIZE), "DequantizeLinear"),
    ("", "DynamicQuantizeLinear"): _per_input(2 * _ARITH + _QUANTIZE),
    ("", "RotaryEmbedding"): _per_output(3 * _ARITH),
    # onnxruntime's contrib ops.
    (_MS, "Attention"): _ms_attention,
    (_MS, "MultiHeadAttention"): _ms_multi_head_attention,
    (_MS, "GroupQueryAttention"): _ms_group_query_attention,
    **_each(_matmul(0, 1), "FusedMatMul MatMulIntegerToFloat DynamicQuantizeMatMul", _MS),
    (_MS, "MatMulNBits"): _matmul_nbits,
    (_MS, "FusedConv"): _conv(1, 2, per_output=_ARITH),
    (_MS, "SkipLayerNormalization"): _per_input(6 * _ARITH, (2, 3, 4)),
    (_MS, "SkipSimplifiedLayerNormalization"): _per_input(4 * _ARITH, (2, 3)),
    (_MS, "SimplifiedLayerNormalization"): _per_input(3 * _ARITH, (1,)),
    (_MS, "Gelu"): _elementwise(_GELU),
    (_MS, "FastGelu"): _per_input(_GELU, (1,)),
    (_MS, "BiasGelu"): _elementwise(_GELU + _ARITH),
    (_MS, "QuickGelu"): _elementwise(_TRANSCENDENTAL + 2 * _ARITH),
    (_MS, "BiasAdd"): _elementwise(2 * _ARITH),
    (_MS, "BiasSoftmax"): _per_input(_SOFTMAX + _ARITH),
    (_MS, "RotaryEmbedding"): _per_output(3 * _ARITH),
    **_each(_per_input(_QUANTIZE), "QuantizeLinear", _MS),
    **_each(_per_input(_DEQUANTIZE), "DequantizeLinear", _MS),
}
