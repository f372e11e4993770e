"""The per-op FLOPs table: exact counts per family, the default, and onnx-inferred shapes."""

from __future__ import annotations

import math

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from sharderd.graph.flops import DEFAULT_FLOPS_PER_OUTPUT_ELEMENT, FlopsEstimate, node_flops

Node = onnx.NodeProto
MS = "com.microsoft"


def _node(op: str, n_in: int = 1, n_out: int = 1, domain: str = "", **attrs: object) -> Node:
    inputs = [f"i{k}" for k in range(n_in)]
    outputs = [f"o{k}" for k in range(n_out)]
    return helper.make_node(op, inputs, outputs, domain=domain or None, **attrs)


def _flops(node: onnx.NodeProto, ins: list, outs: list) -> float:
    est = node_flops(node, ins, outs)
    assert est.known, f"{node.op_type} fell back to the default"
    return est.flops


class TestMatMul:
    def test_batched_times_matrix(self) -> None:
        """[2,3,4]×[4,5] is 2·batch·M·K·N."""
        assert _flops(_node("MatMul", 2), [(2, 3, 4), (4, 5)], [(2, 3, 5)]) == 2 * 2 * 3 * 4 * 5

    def test_broadcast_batch_dims(self) -> None:
        """Batch dims broadcast: [2,1,3,4]×[5,4,6] runs 2·5 matrix products."""
        assert _flops(_node("MatMul", 2), [(2, 1, 3, 4), (5, 4, 6)], [None]) == 2 * 10 * 3 * 4 * 6

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ((4,), (4, 5), 2 * 4 * 5),
            ((3, 4), (4,), 2 * 3 * 4),
            ((4,), (4,), 2 * 4),
            ((4,), (7, 4, 5), 2 * 7 * 4 * 5),
        ],
    )
    def test_one_dimensional_operands(self, a: tuple, b: tuple, expected: int) -> None:
        """A 1-D operand is a vector: its promoted dim of 1 adds no work."""
        assert _flops(_node("MatMul", 2), [a, b], [None]) == expected

    def test_incompatible_batches_fall_back(self) -> None:
        """Batch dims that do not broadcast give the default, flagged unknown."""
        est = node_flops(_node("MatMul", 2), [(2, 3, 4), (3, 4, 5)], [(6, 3, 5)])
        assert est == FlopsEstimate(90.0 * DEFAULT_FLOPS_PER_OUTPUT_ELEMENT, False)

    @settings(max_examples=60, deadline=None)
    @given(
        batch=st.lists(st.integers(1, 4), max_size=3),
        m=st.integers(1, 64),
        k=st.integers(1, 64),
        n=st.integers(1, 64),
    )
    def test_property_two_mnk_batch(self, batch: list[int], m: int, k: int, n: int) -> None:
        """For any batched MatMul, flops == 2·M·N·K·batch."""
        b = tuple(batch)
        est = node_flops(_node("MatMul", 2), [(*b, m, k), (k, n)], [(*b, m, n)])
        assert est == FlopsEstimate(2.0 * m * n * k * math.prod(b), True)

    def test_integer_and_qlinear(self) -> None:
        """MatMulInteger counts like MatMul; QLinearMatMul reads B at input 3 and requantizes."""
        assert _flops(_node("MatMulInteger", 4), [(3, 4), (4, 5), None, None], [(3, 5)]) == 120
        qlinear = _node("QLinearMatMul", 8)
        shapes = [(3, 4), (), (), (4, 5), (), (), (), ()]
        assert _flops(qlinear, shapes, [(3, 5)]) == 120 + 4 * 15

    def test_fused_matmul_transposes(self) -> None:
        """com.microsoft FusedMatMul honours transB."""
        node = _node("FusedMatMul", 2, domain=MS, transB=1)
        assert _flops(node, [(2, 3, 4), (2, 5, 4)], [(2, 3, 5)]) == 2 * 2 * 3 * 4 * 5

    def test_matmul_nbits(self) -> None:
        """MatMulNBits takes K and N from attributes and dequantizes the weights once."""
        node = _node("MatMulNBits", 3, domain=MS, K=64, N=32, bits=4, block_size=32)
        assert _flops(node, [(1, 7, 64), None, None], [(1, 7, 32)]) == 2 * 7 * 64 * 32 + 2 * 64 * 32


class TestGemm:
    def test_trans_b_with_bias(self) -> None:
        """Gemm A[3,4]·B[5,4]ᵀ + C costs 2·M·N·K plus M·N bias adds."""
        node = _node("Gemm", 3, transB=1)
        assert _flops(node, [(3, 4), (5, 4), (5,)], [(3, 5)]) == 2 * 3 * 4 * 5 + 15

    def test_trans_a_without_bias(self) -> None:
        """transA reads M and K from A's swapped dims; no C means no adds."""
        assert _flops(_node("Gemm", 2, transA=1), [(4, 3), (4, 5)], [(3, 5)]) == 2 * 3 * 4 * 5

    def test_unknown_weight_shape_defaults(self) -> None:
        """Without B's shape the default per output element is used and flagged."""
        assert node_flops(_node("Gemm", 2), [(3, 4), None], [(3, 5)]) == FlopsEstimate(15.0, False)


class TestConv:
    def test_grouped_conv_with_bias(self) -> None:
        """Grouped Conv: each output is a dot product over C/group × kernel, plus one bias add."""
        node = _node("Conv", 3, group=4, kernel_shape=[3, 3])
        out = (1, 8, 8, 8)
        assert _flops(node, [(1, 8, 10, 10), (8, 2, 3, 3), (8,)], [out]) == 512 * (2 * 2 * 9 + 1)

    def test_dilation_does_not_change_count(self) -> None:
        """Dilation spreads the taps but does not add any."""
        plain = _flops(_node("Conv", 2), [(1, 3, 9, 9), (4, 3, 3, 3)], [(1, 4, 5, 5)])
        dilated_node = _node("Conv", 2, dilations=[2, 2])
        dilated = _flops(dilated_node, [(1, 3, 9, 9), (4, 3, 3, 3)], [(1, 4, 5, 5)])
        assert plain == dilated == 2 * 100 * 27

    def test_conv_transpose(self) -> None:
        """ConvTranspose: every input element scatters into M/group × kernel outputs."""
        node = _node("ConvTranspose", 3)
        flops = _flops(node, [(1, 4, 5, 5), (4, 2, 3, 3), (2,)], [(1, 2, 7, 7)])
        assert flops == 2 * 100 * 2 * 9 + 98

    def test_integer_and_qlinear(self) -> None:
        """ConvInteger has no bias; QLinearConv reads W at input 3, bias at 8, and requantizes."""
        integer = _node("ConvInteger", 2)
        assert _flops(integer, [(1, 3, 5, 5), (2, 3, 1, 1)], [(1, 2, 5, 5)]) == 50 * 6
        shapes = [(1, 3, 5, 5), (), (), (2, 3, 1, 1), (), (), (), (), (2,)]
        assert _flops(_node("QLinearConv", 9), shapes, [(1, 2, 5, 5)]) == 50 * (6 + 1 + 4)

    def test_unknown_output_defaults_to_zero(self) -> None:
        """With neither the output shape nor a formula, the estimate is 0 and flagged."""
        est = node_flops(_node("Conv", 2), [(1, 3, 5, 5), (2, 3, 1, 1)], [None])
        assert est == FlopsEstimate(0.0, False)


class TestEinsum:
    @pytest.mark.parametrize(
        ("equation", "shapes", "expected"),
        [
            ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 2 * 2 * 3 * 4 * 5),
            ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)], 2 * 1 * 2 * 3 * 4 * 5),
            ("ij,jk", [(3, 4), (4, 5)], 2 * 3 * 4 * 5),
            ("...ij,...jk->...ik", [(6, 3, 4), (1, 4, 5)], 2 * 6 * 3 * 4 * 5),
            ("ij,ij->ij", [(3, 4), (3, 4)], 12),
            ("ij->", [(3, 4)], 12),
            ("ij->ji", [(3, 4)], 0),
        ],
    )
    def test_equation(self, equation: str, shapes: list, expected: int) -> None:
        """All index sizes multiplied; ×2 when a product is summed, ×1 for a product or sum alone."""
        assert _flops(_node("Einsum", len(shapes), equation=equation), shapes, [None]) == expected

    def test_unparsable_equation_defaults(self) -> None:
        """An equation that does not match the inputs falls back to the default."""
        est = node_flops(_node("Einsum", 2, equation="ij,jk,kl->il"), [(3, 4), (4, 5)], [(3, 5)])
        assert est == FlopsEstimate(15.0, False)
        extra_dim = node_flops(
            _node("Einsum", 2, equation="ij,jk->ik"), [(2, 3, 4), (4, 5)], [None]
        )
        assert extra_dim == FlopsEstimate(0.0, False)


class TestAttention:
    def test_onnx_attention_4d(self) -> None:
        """Opset-23 Attention: QKᵀ, scale and softmax per score, AV; past keys lengthen KV."""
        node = _node("Attention", 6)
        ins = [(2, 4, 3, 8), (2, 4, 5, 8), (2, 4, 5, 16), None, (2, 4, 7, 8), (2, 4, 7, 16)]
        scores = 2 * 4 * 3 * (5 + 7)
        assert _flops(node, ins, [(2, 4, 3, 16)]) == scores * (2 * 8 + 2 * 16 + 1 + 8)

    def test_onnx_attention_3d_grouped(self) -> None:
        """3-D Attention takes head counts from attributes; GQA shares fewer KV heads."""
        node = _node("Attention", 3, q_num_heads=4, kv_num_heads=2)
        ins = [(2, 3, 32), (2, 5, 16), (2, 5, 16)]
        assert _flops(node, ins, [(2, 3, 32)]) == 2 * 4 * 3 * 5 * (2 * 8 + 2 * 8 + 9)

    def test_ms_attention_includes_projection(self) -> None:
        """com.microsoft Attention adds the fused QKV projection and its bias."""
        node = _node("Attention", 3, domain=MS, num_heads=2)
        flops = _flops(node, [(1, 4, 8), (8, 24), (24,)], [(1, 4, 8)])
        assert flops == 2 * 4 * 8 * 24 + 4 * 24 + 1 * 2 * 4 * 4 * (2 * 4 + 2 * 4 + 9)

    def test_ms_multi_head_attention(self) -> None:
        """com.microsoft MultiHeadAttention with separate Q, K, V and a past key cache."""
        node = _node("MultiHeadAttention", 7, domain=MS, num_heads=2)
        ins = [(1, 3, 8), (1, 5, 8), (1, 5, 8), None, None, None, (1, 2, 6, 4)]
        assert _flops(node, ins, [(1, 3, 8)]) == 2 * 3 * 11 * (2 * 4 + 2 * 4 + 9)

    def test_ms_group_query_attention_uses_present_length(self) -> None:
        """GroupQueryAttention reads the attended length off the present-key output."""
        node = _node("GroupQueryAttention", 3, 3, domain=MS, num_heads=4, kv_num_heads=2)
        ins, outs = [(1, 1, 32), (1, 1, 16), (1, 1, 16)], [(1, 1, 32), (1, 2, 9, 8), (1, 2, 9, 8)]
        assert _flops(node, ins, outs) == 4 * 9 * (2 * 8 + 2 * 8 + 9)


class TestRecurrent:
    def test_bidirectional_lstm_with_bias(self) -> None:
        """LSTM: per step and direction, [x,h]×4 gates, 5 transcendentals, 4 ops, 8 bias adds."""
        node = _node("LSTM", 4, hidden_size=4, direction="bidirectional")
        ins = [(5, 2, 3), (2, 16, 3), (2, 16, 4), (2, 32)]
        assert _flops(node, ins, [None]) == 5 * 2 * 2 * 4 * (2 * 4 * 7 + 5 * 4 + 4 + 8)

    def test_gru_batch_first_layout(self) -> None:
        """GRU with layout=1 reads [batch, seq, input] and takes hidden size from R."""
        node = _node("GRU", 3, layout=1)
        ins = [(2, 6, 3), (1, 12, 3), (1, 12, 4)]
        assert _flops(node, ins, [None]) == 6 * 2 * 4 * (2 * 3 * 7 + 3 * 4 + 5)

    def test_rnn(self) -> None:
        """A plain RNN is one gate and one tanh per hidden unit per step."""
        node = _node("RNN", 3, hidden_size=4)
        assert _flops(node, [(5, 2, 3), (1, 4, 3), (1, 4, 4)], [None]) == 5 * 2 * 4 * (2 * 7 + 4)


class TestNormalization:
    @pytest.mark.parametrize(
        ("op", "n_in", "domain", "per_element"),
        [
            ("LayerNormalization", 3, "", 7),
            ("LayerNormalization", 2, "", 6),
            ("InstanceNormalization", 3, "", 7),
            ("GroupNormalization", 3, "", 7),
            ("BatchNormalization", 5, "", 4),
            ("SimplifiedLayerNormalization", 2, "", 4),
            ("RMSNormalization", 2, "", 4),
            ("SkipLayerNormalization", 5, "com.microsoft", 9),
            ("SkipSimplifiedLayerNormalization", 3, "com.microsoft", 5),
        ],
    )
    def test_per_element_cost(self, op: str, n_in: int, domain: str, per_element: int) -> None:
        """Statistics, normalisation and each present affine/skip/bias input cost per element."""
        node = _node(op, n_in, domain=domain, num_groups=2)
        ins = [(2, 4, 3), *[(4,)] * (n_in - 1)]
        assert _flops(node, ins, [(2, 4, 3)]) == 24 * per_element

    def test_softmax_is_dearer_than_add(self) -> None:
        """Softmax and LogSoftmax pay an exp per element on top of four arithmetic ops."""
        assert _flops(_node("Softmax"), [(2, 10)], [(2, 10)]) == 20 * 8
        assert _flops(_node("LogSoftmax"), [(2, 10)], [(2, 10)]) == 20 * 8


class TestPoolingAndResampling:
    def test_window_pools(self) -> None:
        """MaxPool/AveragePool/LpPool cost kernel size per output element."""
        for op in ("MaxPool", "AveragePool", "LpPool"):
            node = _node(op, kernel_shape=[3, 3], strides=[2, 2])
            assert _flops(node, [(1, 2, 9, 9)], [(1, 2, 4, 4)]) == 9 * 32

    def test_global_pools(self) -> None:
        """Global pools touch every input element once."""
        assert _flops(_node("GlobalAveragePool"), [(1, 2, 4, 4)], [(1, 2, 1, 1)]) == 32
        assert _flops(_node("GlobalMaxPool"), [(1, 2, 4, 4)], [(1, 2, 1, 1)]) == 32

    @pytest.mark.parametrize(
        ("mode", "per_output"), [("nearest", 1), ("linear", 2 * 4), ("cubic", 2 * 16)]
    )
    def test_resize_modes(self, mode: str, per_output: int) -> None:
        """Resize costs one MAC per tap, taps growing as 2^dims (linear) or 4^dims (cubic)."""
        node = _node("Resize", 3, mode=mode)
        assert _flops(node, [(1, 3, 4, 4), None, (4,)], [(1, 3, 8, 8)]) == 192 * per_output


class TestElementwise:
    def test_broadcast_add_counts_outputs(self) -> None:
        """A broadcast Add costs one FLOP per output element, recovered from inputs if needed."""
        assert _flops(_node("Add", 2), [(3, 1), (1, 4)], [(3, 4)]) == 12
        assert _flops(_node("Add", 2), [(3, 1), (1, 4)], [None]) == 12

    def test_transcendentals_cost_more(self) -> None:
        """Exp, Tanh and Sigmoid cost 4 per element, Gelu 8, Relu 1."""
        costs = {
            op: _flops(_node(op), [(10,)], [(10,)])
            for op in ("Relu", "Exp", "Tanh", "Sigmoid", "Gelu")
        }
        assert costs == {"Relu": 10, "Exp": 40, "Tanh": 40, "Sigmoid": 40, "Gelu": 80}

    def test_variadic_sum_and_omitted_clip_bounds(self) -> None:
        """Sum of n inputs is n-1 adds per element; omitted Clip bounds do not block the fallback."""
        assert _flops(_node("Sum", 4), [(5,)] * 4, [(5,)]) == 15
        clip = helper.make_node("Clip", ["x", "", "hi"], ["y"])
        assert _flops(clip, [(2, 3), None, ()], [None]) == 6

    def test_quantize_dequantize(self) -> None:
        """QuantizeLinear costs 4 per element, DequantizeLinear 2."""
        assert _flops(_node("QuantizeLinear", 3), [(2, 8), (), ()], [(2, 8)]) == 64
        assert _flops(_node("DequantizeLinear", 3), [(2, 8), (), ()], [(2, 8)]) == 32


class TestReductionsAndIndexing:
    def test_reductions_count_inputs(self) -> None:
        """ReduceSum, ReduceMean, ArgMax and CumSum touch each input element once."""
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ArgMax", "CumSum"):
            assert _flops(_node(op), [(4, 5)], [(4, 1)]) == 20

    def test_topk_logarithmic_in_k(self) -> None:
        """TopK keeps a heap of k: log2(k) comparisons per input element."""
        assert _flops(_node("TopK", 2, 2, axis=1), [(2, 100), (1,)], [(2, 8), (2, 8)]) == 200 * 3

    def test_gather_and_scatter(self) -> None:
        """Gather costs one op per gathered element; ScatterND one per update, two when reducing."""
        assert _flops(_node("Gather", 2), [(100, 16), (7,)], [(7, 16)]) == 112
        assert _flops(_node("ScatterND", 3), [(10, 4), (3, 1), (3, 4)], [(10, 4)]) == 12
        assert (
            _flops(_node("ScatterND", 3, reduction="add"), [(10, 4), (3, 1), (3, 4)], [(10, 4)])
            == 24
        )


class TestFreeAndUnknown:
    @pytest.mark.parametrize(
        "op",
        [
            "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Constant",
            "ConstantOfShape", "Transpose", "Concat", "Split", "Slice", "Pad", "Expand", "Tile", "Dropout",
        ],
    )  # fmt: skip
    def test_data_movement_is_free(self, op: str) -> None:
        """Pure data movement costs 0 FLOPs and is still a known op."""
        assert node_flops(_node(op, 2), [(8, 8), (2,)], [(64,)]) == FlopsEstimate(0.0, True)

    @pytest.mark.parametrize("op", ["If", "Loop", "Scan"])
    def test_control_flow_left_to_caller(self, op: str) -> None:
        """Control-flow nodes count 0 here: the caller adds their bodies."""
        assert node_flops(_node(op, 1), [(1,)], [(3, 3)]) == FlopsEstimate(0.0, True)

    def test_unknown_op_uses_default(self) -> None:
        """An op outside the table costs the default per output element and is flagged."""
        est = node_flops(_node("Frobnicate", 1, 2, domain="example.custom"), [(9,)], [(2, 3), (4,)])
        assert est == FlopsEstimate(10 * DEFAULT_FLOPS_PER_OUTPUT_ELEMENT, False)

    def test_unknown_op_without_shapes_is_zero(self) -> None:
        """An unknown op whose outputs have no shapes costs 0, flagged."""
        assert node_flops(
            _node("Frobnicate", domain="example.custom"), [None], [None]
        ) == FlopsEstimate(0.0, False)

    def test_domain_matters(self) -> None:
        """A custom-domain Add is unknown; ai.onnx is the default domain."""
        assert not node_flops(_node("Add", 2, domain="example.custom"), [(3,), (3,)], [(3,)]).known
        assert node_flops(_node("Add", 2, domain="ai.onnx"), [(3,), (3,)], [(3,)]) == FlopsEstimate(
            3.0, True
        )

    def test_malformed_ranks_fall_back(self) -> None:
        """Shapes of a rank the op does not allow give the default instead of an exception."""
        node = _node("MultiHeadAttention", 3, domain=MS, num_heads=2)
        est = node_flops(node, [(1, 3, 8), (1, 5, 8), ()], [(1, 3, 8)])
        assert est == FlopsEstimate(24.0, False)

    def test_unresolved_dims_count_as_unknown(self) -> None:
        """A negative (unresolved) dim makes the shape unknown, so the default is used."""
        est = node_flops(_node("MatMul", 2), [(-1, 4), (4, 5)], [(2, 5)])
        assert est == FlopsEstimate(10.0, False)

    def test_huge_shapes_stay_finite(self) -> None:
        """Counts past int64 (2^81 here) come back exact as floats, not wrapped around."""
        est = node_flops(_node("MatMul", 2), [(2**20, 2**20, 2**20), (2**20, 2**20)], [None])
        assert est.flops == 2.0**81


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = tuple(d.dim_value for d in dims)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def test_counts_agree_with_onnx_shape_inference() -> None:
    """On a real model, shapes from onnx's own inference give the hand-computed counts."""
    f = TensorProto.FLOAT
    weights = [
        helper.make_tensor("w_conv", f, [8, 3, 3, 3], [0.0] * 216),
        helper.make_tensor("w_fc", f, [16, 128], [0.0] * 2048),
        helper.make_tensor("w_mm", f, [16, 4], [0.0] * 64),
        helper.make_tensor("w_lstm", f, [1, 20, 4], [0.0] * 80),
        helper.make_tensor("r_lstm", f, [1, 20, 5], [0.0] * 100),
        helper.make_tensor("flat_shape", TensorProto.INT64, [2], [2, 128]),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_conv"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w_fc"], ["fc"], transB=1),
        helper.make_node("MatMul", ["fc", "w_mm"], ["mm"]),
        helper.make_node("Einsum", ["mm", "mm"], ["outer"], equation="bi,bj->bij"),
        helper.make_node("LSTM", ["outer", "w_lstm", "r_lstm"], ["y"], hidden_size=5),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", f, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", f, None)],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    shapes = _inferred_shapes(model)
    got = {
        n.op_type: _flops(n, [shapes.get(i) for i in n.input], [shapes.get(o) for o in n.output])
        for n in model.graph.node
    }
    assert shapes["p"] == (2, 8, 4, 4) and shapes["y"] == (2, 1, 4, 5)
    assert got == {
        "Conv": 2 * 8 * 8 * 8 * (2 * 27),
        "Relu": 2 * 8 * 8 * 8,
        "MaxPool": 4 * 2 * 8 * 4 * 4,
        "Reshape": 0,
        "Gemm": 2 * 2 * 16 * 128,
        "MatMul": 2 * 2 * 4 * 16,
        "Einsum": 2 * 4 * 4,
        "LSTM": 2 * 4 * 5 * (2 * 4 * (4 + 5) + 5 * 4 + 4),
    }
