"""What holds the bottleneck (plan/held.py) and the fewest devices that keep the predicted
throughput (plan/fewest.py, engine.make_auto_plan), each just inside and just outside its
threshold, on chains whose node times are measured (so every number is set by the test)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from dag_cases import loaded
from onnx import TensorProto, helper

from sharderd.config import PlanConfig
from sharderd.engine import make_auto_plan, make_plan
from sharderd.graph.analyze import Analysis, analyze
from sharderd.plan.fewest import THROUGHPUT_BAND
from sharderd.plan.held import HOLD_SHARE
from sharderd.plan.planner import plan_stages
from sharderd.target import BUILTIN_TARGETS

HOST = 4e6
"""Host link of the held-by cases: 32 bytes of output cost 8 µs."""
TARGET = replace(BUILTIN_TARGETS["ipu-mk2"], host_bytes_per_s=HOST)


def _chain(width: int, nodes: int, out: int = 8) -> Analysis:
    """x [1, width] → n0 (MatMul to [1, 8]) → n1 → ... → the graph output [1, ``out``]."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((width, 8)).astype(np.float32), "w0")]
    made = [helper.make_node("MatMul", ["x", "w0"], ["t0"], name="n0")]
    for i in range(1, nodes):
        cols = out if i == nodes - 1 else 8
        inits.append(
            onnx.numpy_helper.from_array(rng.standard_normal((8, cols)).astype(np.float32), f"w{i}")
        )
        made.append(helper.make_node("MatMul", [f"t{i - 1}", f"w{i}"], [f"t{i}"], name=f"n{i}"))
    graph = helper.make_graph(
        made,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"t{nodes - 1}", TensorProto.FLOAT, [1, out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return analyze(loaded(model), PlanConfig())


@pytest.mark.parametrize(("first_us", "held"), [(65.8, True), (66.2, False)])
def test_an_output_transfer_is_named_when_it_is_half_the_stage(first_us: float, held: bool) -> None:
    """One stage: x in (8 µs), n0 ``first_us``, n1 10 µs and its 256-byte output out (64 µs).
    n1's unmovable 74 µs is half the stage exactly when n0 takes 66 µs."""
    analysis = _chain(8, 2, out=64)
    plan = plan_stages(
        analysis, TARGET, 1, safety_margin=1.0, measured_s=np.array([first_us * 1e-6, 10e-6])
    )
    assert plan.bottleneck_s == pytest.approx((first_us + 82) * 1e-6, rel=1e-6)
    if not held:
        assert plan.held_by is None
        return
    assert plan.held_by is not None
    h = plan.held_by
    assert (h.kind, h.node, h.tensors, h.bytes) == ("host_output", "n1", ("t1",), 256)
    assert h.time_s == pytest.approx(74e-6, rel=1e-6)
    assert h.transfer_s == pytest.approx(64e-6, rel=1e-6)
    assert h.share == pytest.approx(74 / (first_us + 82), rel=1e-6) and h.share > HOLD_SHARE
    assert "the host transfer of output t1 (256 bytes) from n1: 74.0 µs" in h.describe()


def test_an_op_alone_and_an_input_transfer_are_named() -> None:
    """n1's compute is most of its cost: an op; a wide input streamed in dominates: its transfer."""
    op = plan_stages(
        _chain(8, 2), TARGET, 1, safety_margin=1.0, measured_s=np.array([1e-6, 100e-6])
    ).held_by
    assert op is not None and (op.kind, op.node, op.tensors, op.bytes) == ("op", "n1", (), 0)
    assert "op n1 (MatMul) alone" in op.describe()
    wide = plan_stages(
        _chain(4096, 2), TARGET, 1, safety_margin=1.0, measured_s=np.array([1e-6, 1e-6])
    ).held_by
    assert wide is not None and (wide.kind, wide.tensors, wide.bytes) == (
        "host_input",
        ("x",),
        16384,
    )
    assert wide.time_s == pytest.approx(16384 / HOST + 1e-6, rel=1e-6)


@pytest.mark.parametrize(("rest_us", "fewest"), [(50.25, 2), (50.75, 3)])
def test_fewest_devices_is_the_smallest_count_within_the_band(rest_us: float, fewest: int) -> None:
    """n0 takes 100 µs, n1 and n2 ``rest_us`` each: three devices run at 100 µs, two at
    2 × ``rest_us`` (100.5 µs: within 1%; 101.5 µs: outside), one at twice that."""
    analysis = _chain(8, 3)
    times = {"n0": 100e-6, "n1": rest_us * 1e-6, "n2": rest_us * 1e-6}
    target = BUILTIN_TARGETS["ipu-mk2"]
    plan = make_plan(analysis, target, 3, PlanConfig(safety_margin=1.0), measured_times=times)
    assert plan.devices == 3 and plan.fewest_devices == fewest
    two = make_plan(analysis, target, 2, PlanConfig(safety_margin=1.0), measured_times=times)
    assert (two.bottleneck_s <= plan.bottleneck_s * (1 + THROUGHPUT_BAND)) == (fewest == 2)
    auto = make_auto_plan(analysis, target, 3, PlanConfig(safety_margin=1.0), measured_times=times)
    assert (auto.devices, auto.max_devices, auto.fewest_devices) == (fewest, 3, fewest)
    assert auto.bottleneck_s <= plan.bottleneck_s * (1 + THROUGHPUT_BAND)
    assert plan.timings_s["fewest_devices_plans"] == 1  # one device is ruled out by the bound


def test_no_fewest_search_under_learned_corrections() -> None:
    """Corrections learned from compiles apply to one device count: no search, no claim."""
    analysis = _chain(8, 3)
    plan = make_plan(
        analysis, BUILTIN_TARGETS["ipu-mk2"], 3, PlanConfig(), memory_scale=[1.0, 1.0, 1.0]
    )
    assert plan.fewest_devices is None and "fewest_devices" not in plan.timings_s
