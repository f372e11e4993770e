"""Views and in-place ops take over their input's memory (graph/buffers.py), and every liveness
computation of the planner counts that memory once."""

from __future__ import annotations

import numpy as np
import onnx
from dag_cases import TARGET, loaded
from onnx import TensorProto, helper

from sharderd.config import PlanConfig
from sharderd.graph.analyze import Analysis, analyze
from sharderd.plan.bounds import memory_floor
from sharderd.plan.ideals import solve_ideals
from sharderd.plan.infeasible import activation_bytes
from sharderd.plan.ordered_costs import calibrated_compute_s, ordered_costs
from sharderd.plan.stage_memory import StageMemory
from tests.real_exports import export_analysis

N = 1024
BUF = 4 * N
"""Bytes of one [1, N] float tensor."""


def _model(nodes: list[onnx.NodeProto], outputs: list[str], width: dict[str, int]) -> Analysis:
    inits = [
        onnx.numpy_helper.from_array(np.ones((1, N), dtype=np.float32), "bias"),
        onnx.numpy_helper.from_array(np.ones((N, N), dtype=np.float32), "w"),
    ]
    used = {x for node in nodes for x in node.input}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
        [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, width.get(o, N)])
            for o in outputs
        ],
        [t for t in inits if t.name in used],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return analyze(loaded(model), PlanConfig())


def _tensor(analysis: Analysis, name: str) -> int:
    return analysis.flow.tensor_names.index(name)


def _chain() -> Analysis:
    """x → MatMul → h → Add(bias) → a → Relu → r → Softmax → s: each reads an input only it reads."""
    return _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "bias"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=-1),
        ],
        ["s"],
        {},
    )


def test_a_chain_of_in_place_ops_holds_one_buffer() -> None:
    analysis = _chain()
    src = analysis.alias_source
    assert src is not None
    assert [int(src[_tensor(analysis, t)]) for t in ("h", "a", "r", "s")] == [
        -1,
        _tensor(analysis, "h"),
        _tensor(analysis, "a"),
        _tensor(analysis, "r"),
    ]
    order = analysis.flow.topo_order
    oc = ordered_costs(analysis, TARGET, order)
    # The MatMul holds x and h; from the Add on, one buffer (three in place, not three buffers).
    assert oc.live_bytes.tolist() == [2 * BUF, BUF, BUF, BUF]
    assert oc.stage_memory(1, 4)[1] == BUF
    # The same count by the general-split memory and the DP over ideals.
    stage = np.zeros(4, dtype=bool)
    stage[1:] = True
    mem = StageMemory.build(analysis, TARGET, order)
    weights, _, code = oc.stage_memory(1, 4)
    assert mem.bytes(~stage, stage) == weights + BUF + code
    # Every node alone: its input and new outputs; a Softmax in place needs its one buffer.
    softmax = analysis.flow.node_names.index("softmax")
    assert activation_bytes(analysis, softmax) == BUF
    floor = memory_floor(analysis, TARGET).node_bytes
    assert floor[softmax] == BUF + TARGET.code_bytes_for("Softmax")
    compute = calibrated_compute_s(analysis, TARGET, None)
    one = solve_ideals(
        analysis,
        TARGET,
        compute,
        order,
        np.array([sum(oc.stage_memory(0, 4))]),
        require_costed=True,
    )
    assert one is not None and one.assignment is not None
    short = solve_ideals(
        analysis,
        TARGET,
        compute,
        order,
        np.array([sum(oc.stage_memory(0, 4)) - 1]),
        require_costed=True,
    )
    assert short is not None and short.assignment is None


def test_an_input_read_again_later_is_not_overwritten() -> None:
    """Relu's input x is read by the Add after it: the Relu takes new memory; the Add may
    overwrite r (only it reads r) but not x."""
    analysis = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Add", ["h", "r"], ["y"], name="add"),
        ],
        ["y"],
        {},
    )
    src = analysis.alias_source
    assert src is not None
    assert src[_tensor(analysis, "r")] == -1
    assert src[_tensor(analysis, "y")] == _tensor(analysis, "r")
    oc = ordered_costs(analysis, TARGET, analysis.flow.topo_order)
    assert oc.live_bytes.tolist() == [2 * BUF, 2 * BUF, 2 * BUF]


def test_graph_outputs_growth_and_non_in_place_ops_take_new_memory() -> None:
    """h is a graph output (the host reads it), Tanh has no in-place variant in PopART, Concat
    reads two inputs: none of their readers reuses an input; the Identity after them does."""
    analysis = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Tanh", ["r"], ["t"], name="tanh"),
            helper.make_node("Concat", ["t", "t"], ["c"], name="concat", axis=1),
            helper.make_node("Identity", ["c"], ["i"], name="identity"),
        ],
        ["h", "i"],
        {"i": 2 * N},
    )
    src = analysis.alias_source
    assert src is not None
    assert src[_tensor(analysis, "r")] == -1  # h is a graph output
    assert src[_tensor(analysis, "t")] == -1  # Tanh
    assert src[_tensor(analysis, "c")] == -1  # Concat
    assert src[_tensor(analysis, "i")] == _tensor(analysis, "c")  # a view of c, same size
    assert analysis.node_new_bytes().tolist() == [BUF, BUF, BUF, 2 * BUF, 0]


def test_a_graph_input_keeps_its_stream_buffer() -> None:
    """Relu reads the graph input x alone: x stays the host's stream buffer, r takes new memory."""
    analysis = _model([helper.make_node("Relu", ["x"], ["r"], name="relu")], ["r"], {})
    src = analysis.alias_source
    assert src is not None and src[_tensor(analysis, "r")] == -1
    assert ordered_costs(analysis, TARGET, analysis.flow.topo_order).live_bytes.tolist() == [
        2 * BUF
    ]


def test_the_unet_softmax_over_its_64x64_latent_counts_one_buffer() -> None:
    """The [1, 4096, 4096] attention scores: the Softmax alone needs them once, not twice."""
    analysis = export_analysis("unet_attn64")
    flow, tb = analysis.flow, analysis.costs.tensor_bytes
    (softmax,) = [q for q in range(flow.num_nodes) if flow.op_types[q] == "Softmax"]
    (scores,) = flow.inputs(softmax)
    assert tb[scores] == 4 * 4096 * 4096
    assert activation_bytes(analysis, softmax) == tb[scores]


def test_an_add_that_broadcasts_its_input_larger_takes_new_memory() -> None:
    """The same-size condition: h [1, N], read by the Add alone, is added to a [2, N] weight; the
    output is twice h's bytes, so it cannot be made in h's memory (it would count N bytes less).
    The same Add with a [1, N] weight is made in place (the chain above)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "wide"], ["y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("x", f, [1, N])],
        [helper.make_tensor_value_info("y", f, [2, N])],
        [
            onnx.numpy_helper.from_array(np.ones((N, N), dtype=np.float32), "w"),
            onnx.numpy_helper.from_array(np.ones((2, N), dtype=np.float32), "wide"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    analysis = analyze(loaded(model), PlanConfig())
    src = analysis.alias_source
    assert src is not None and src[_tensor(analysis, "y")] == -1
    assert analysis.node_new_bytes().tolist() == [BUF, 2 * BUF]
    oc = ordered_costs(analysis, TARGET, analysis.flow.topo_order)
    assert oc.live_bytes.tolist() == [2 * BUF, 3 * BUF]
