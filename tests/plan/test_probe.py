"""Which node a probe compiles alone, on real exports: the heaviest by the model, only when a
plausible factor could make it overflow a device on its own."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest
from real_exports import export_analysis

from sharderd.plan.bounds import memory_floor
from sharderd.plan.probe import PROBE_MIN_NEED, probe_target
from sharderd.target import BUILTIN_TARGETS, Target

TARGET = BUILTIN_TARGETS["ipu-mk2"]
NAMES = ["tiny_gpt2", "tiny_bert", "tiny_efficientnet", "tiny_unet"]


def _holding(floor: float, share: float) -> Target:
    """A target on which a node of ``floor`` bytes needs ``share`` of a device."""
    return Target(**{**asdict(TARGET), "memory_bytes": int(floor / share)})


@pytest.mark.parametrize("name", NAMES)
def test_the_heaviest_node_is_probed_when_a_factor_could_sink_it(name: str) -> None:
    analysis = export_analysis(name)
    floor = memory_floor(analysis, TARGET).node_bytes
    heaviest = int(np.argmax(floor))
    target = _holding(float(floor[heaviest]), 0.7)
    found = probe_target(analysis, target)
    assert found is not None
    name, view = found
    assert view.runs == ((heaviest, heaviest + 1),)
    assert name == analysis.flow.node_names[heaviest]
    assert view.predicted == pytest.approx(float(floor[heaviest]) / target.memory_bytes)
    assert view.predicted == pytest.approx(0.7, abs=2.0 / target.memory_bytes)  # int capacity
    assert 0.0 < view.code_share <= 1.0


@pytest.mark.parametrize("name", NAMES)
def test_no_probe_when_even_the_cap_cannot_sink_a_node(name: str) -> None:
    analysis = export_analysis(name)
    floor = float(memory_floor(analysis, TARGET).node_bytes.max())
    assert probe_target(analysis, _holding(floor, PROBE_MIN_NEED * 0.9)) is None


def test_the_probe_s_matmul_factor_comes_from_its_output_channels() -> None:
    """tiny_gpt2's MatMuls: the factor of each is ``serial_factor`` of its output's last axis (not
    its input's), 0 for every other op; the lm_head's 2-D weight [hidden, vocab] makes them differ."""
    from sharderd.plan.probe import probe_factor, serial_factor

    analysis = export_analysis("tiny_gpt2")
    types = analysis.shapes.types
    differ = 0
    for index, node in enumerate(analysis.model.graph.node):
        factor = probe_factor(analysis, index)
        if node.op_type != "MatMul":
            assert factor == 0, node.name
            continue
        out = types[node.output[0]].shape
        assert factor == serial_factor("MatMul", out) and factor > 0, node.name
        given = types[node.input[0]].shape
        differ += serial_factor("MatMul", given) != factor
    assert differ > 0


def test_the_first_node_can_be_the_probe_and_exactly_the_minimum_need_is_probed() -> None:
    """A chain whose heaviest node is its first (file index 0) is probed on it; at exactly
    ``PROBE_MIN_NEED`` of a device (a target twice its bytes) it is probed, a byte less need not.
    The view is device 0's, one node, its code share of its own bytes."""
    from dag_cases import loaded
    from onnx import TensorProto, helper, numpy_helper

    from sharderd.config import PlanConfig
    from sharderd.graph.analyze import analyze
    from sharderd.plan.op_costs import node_code_bytes

    w = [np.ones((64, 64), np.float32), np.ones((64, 8), np.float32)]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w0"], ["h"], name="big"),
            helper.make_node("MatMul", ["h", "w1"], ["y"], name="small"),
        ],
        "first",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(a, f"w{k}") for k, a in enumerate(w)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    analysis = analyze(loaded(model), PlanConfig())
    floor = memory_floor(analysis, TARGET).node_bytes
    assert int(np.argmax(floor)) == 0 and float(floor[0]) == int(floor[0])
    exact = Target(**{**asdict(TARGET), "memory_bytes": 2 * int(floor[0])})
    found = probe_target(analysis, exact)
    assert found is not None and found[0] == "big"
    view = found[1]
    assert (view.device, view.runs, view.predicted) == (0, ((0, 1),), PROBE_MIN_NEED)
    code = float(node_code_bytes(analysis, exact)[0])
    assert view.code_share == pytest.approx(code / float(floor[0]))
    assert probe_target(analysis, replace(exact, memory_bytes=exact.memory_bytes + 1)) is None
