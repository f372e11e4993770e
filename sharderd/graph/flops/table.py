"""The op table: which rule prices each (domain, op type); ops missing here get the default.

Kept apart from the formulas so adding an op is one line here (and one in ``docs/flops.md``).
"""

from __future__ import annotations

from sharderd.graph.flops.attention import (
    attention,
    ms_attention,
    ms_group_query_attention,
    ms_multi_head_attention,
)
from sharderd.graph.flops.elementwise import elementwise, per_input, per_output, variadic, zero
from sharderd.graph.flops.matrix_products import (
    conv,
    conv_transpose,
    einsum,
    gemm,
    matmul,
    matmul_nbits,
)
from sharderd.graph.flops.operands import Rule
from sharderd.graph.flops.recurrent import recurrent
from sharderd.graph.flops.unit_costs import (
    ARITH,
    DEQUANTIZE,
    GELU,
    QUANTIZE,
    SOFTMAX,
    TRANSCENDENTAL,
)
from sharderd.graph.flops.windows import pool, resize, scatter, topk

_MS = "com.microsoft"


def _each(rule: Rule, op_types: str, domain: str = "") -> dict[tuple[str, str], Rule]:
    """One rule for several ops, named as a whitespace-separated list."""
    return {(domain, op): rule for op in op_types.split()}


RULES: dict[tuple[str, str], Rule] = {
    # Pure data movement: copies and views cost bandwidth, which the cost model charges apart.
    **_each(
        zero,
        """Reshape Squeeze Unsqueeze Flatten Identity Shape Size Constant ConstantOfShape Transpose
        Concat Split Slice Pad Expand Tile DepthToSpace SpaceToDepth ReverseSequence EyeLike Dropout
        SplitToSequence ConcatFromSequence SequenceConstruct SequenceAt SequenceInsert SequenceErase
        SequenceLength SequenceEmpty Optional OptionalGetElement OptionalHasElement""",
    ),
    # Control flow: the caller adds the bodies' FLOPs.
    **_each(zero, "If Loop Scan SequenceMap"),
    **_each(
        elementwise(ARITH),
        """Add Sub Mul Div Neg Abs Mod Reciprocal Sqrt Floor Ceil Round Sign Relu LeakyRelu PRelu
        ThresholdedRelu Clip Shrink Where Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor
        Not BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot IsNaN IsInf Cast CastLike""",
    ),
    **_each(
        elementwise(TRANSCENDENTAL),
        "Exp Log Pow Tanh Sigmoid Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh",
    ),
    **_each(elementwise(TRANSCENDENTAL + 2 * ARITH), "Elu Selu Celu"),
    ("", "Softplus"): elementwise(2 * TRANSCENDENTAL + ARITH),
    ("", "Mish"): elementwise(3 * TRANSCENDENTAL + ARITH),
    **_each(elementwise(3 * ARITH), "Softsign HardSigmoid"),
    ("", "HardSwish"): elementwise(4 * ARITH),
    ("", "Swish"): elementwise(TRANSCENDENTAL + ARITH),
    ("", "Gelu"): elementwise(GELU),
    **_each(variadic(0.0), "Sum Max Min"),
    ("", "Mean"): variadic(ARITH),
    **_each(
        per_input(ARITH),
        """ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceLogSum ArgMax ArgMin Hardmax
        CumSum NonZero GlobalAveragePool GlobalMaxPool GlobalLpPool""",
    ),
    **_each(per_input(2 * ARITH), "ReduceL1 ReduceL2 ReduceSumSquare"),
    ("", "ReduceLogSumExp"): per_input(ARITH + TRANSCENDENTAL),
    ("", "MatMul"): matmul(0, 1),
    ("", "MatMulInteger"): matmul(0, 1),
    ("", "QLinearMatMul"): matmul(0, 3, per_output=QUANTIZE),
    ("", "Gemm"): gemm,
    ("", "Conv"): conv(1, 2),
    ("", "ConvInteger"): conv(1, None),
    ("", "QLinearConv"): conv(3, 8, per_output=QUANTIZE),
    ("", "ConvTranspose"): conv_transpose,
    ("", "Einsum"): einsum,
    ("", "Attention"): attention,
    ("", "LSTM"): recurrent(gates=4, transcendental=5, arith=4),
    ("", "GRU"): recurrent(gates=3, transcendental=3, arith=5),
    ("", "RNN"): recurrent(gates=1, transcendental=1, arith=0),
    **_each(
        per_input(5 * ARITH, (1, 2)),
        "LayerNormalization InstanceNormalization GroupNormalization",
    ),
    ("", "BatchNormalization"): per_input(2 * ARITH, (1, 2)),
    ("", "MeanVarianceNormalization"): per_input(5 * ARITH),
    ("", "LpNormalization"): per_input(3 * ARITH),
    **_each(per_input(3 * ARITH, (1,)), "RMSNormalization SimplifiedLayerNormalization"),
    **_each(per_input(SOFTMAX), "Softmax LogSoftmax"),
    **_each(pool, "MaxPool AveragePool LpPool"),
    **_each(resize, "Resize Upsample"),
    ("", "TopK"): topk,
    **_each(per_output(ARITH), "Gather GatherElements GatherND Range OneHot Trilu"),
    **_each(scatter, "ScatterND ScatterElements Scatter"),
    **_each(per_input(QUANTIZE), "QuantizeLinear"),
    **_each(per_input(DEQUANTIZE), "DequantizeLinear"),
    ("", "DynamicQuantizeLinear"): per_input(2 * ARITH + QUANTIZE),
    ("", "RotaryEmbedding"): per_output(3 * ARITH),
    # onnxruntime's contrib ops.
    (_MS, "Attention"): ms_attention,
    (_MS, "MultiHeadAttention"): ms_multi_head_attention,
    (_MS, "GroupQueryAttention"): ms_group_query_attention,
    **_each(matmul(0, 1), "FusedMatMul MatMulIntegerToFloat DynamicQuantizeMatMul", _MS),
    (_MS, "MatMulNBits"): matmul_nbits,
    (_MS, "FusedConv"): conv(1, 2, per_output=ARITH),
    (_MS, "SkipLayerNormalization"): per_input(6 * ARITH, (2, 3, 4)),
    (_MS, "SkipSimplifiedLayerNormalization"): per_input(4 * ARITH, (2, 3)),
    (_MS, "SimplifiedLayerNormalization"): per_input(3 * ARITH, (1,)),
    (_MS, "Gelu"): elementwise(GELU),
    (_MS, "FastGelu"): per_input(GELU, (1,)),
    (_MS, "BiasGelu"): elementwise(GELU + ARITH),
    (_MS, "QuickGelu"): elementwise(TRANSCENDENTAL + 2 * ARITH),
    (_MS, "BiasAdd"): elementwise(2 * ARITH),
    (_MS, "BiasSoftmax"): per_input(SOFTMAX + ARITH),
    (_MS, "RotaryEmbedding"): per_output(3 * ARITH),
    **_each(per_input(QUANTIZE), "QuantizeLinear", _MS),
    **_each(per_input(DEQUANTIZE), "DequantizeLinear", _MS),
}
