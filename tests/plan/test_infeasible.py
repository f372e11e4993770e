"""The weight grounds of "does not fit" (exit 3) at their edges: one byte inside a device (or the
devices together) is no proof, one byte outside is, whatever the safety margin; a folded constant
counts for the node that reads it (it is whole on that node's device, folded or not) and not for
the weights held all at once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from dag_cases import loaded
from onnx import TensorProto, helper, numpy_helper

from sharderd.config import PlanConfig
from sharderd.errors import NoSplitError, PlanInfeasibleError
from sharderd.graph.analyze import Analysis, analyze
from sharderd.plan.infeasible import weights_proof
from sharderd.plan.planner import plan_stages
from sharderd.target import BUILTIN_TARGETS, Target

MARGIN = 1.5
"""Far above 1, so a margin let into the weight grounds moves a case across the edge."""
C = 64
W = C * C * 4
"""Bytes of each [C, C] float weight below."""


def _target(memory: int) -> Target:
    return replace(BUILTIN_TARGETS["ipu-mk2"], name="edge", memory_bytes=memory)


def _model(nodes: list[onnx.NodeProto], inits: list[TensorProto], out: str) -> Analysis:
    graph = helper.make_graph(
        nodes,
        "edge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, C])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return analyze(loaded(model), PlanConfig())


def _chain(weights: int) -> Analysis:
    """x → MatMul(W0) → MatMul(W1) → ...: ``weights`` distinct [C, C] weights, one per node, so one
    node holds W bytes and the model ``weights`` × W; nothing else is stored."""
    nodes, inits = [], []
    for k in range(weights):
        inits.append(numpy_helper.from_array(np.zeros((C, C), np.float32), f"W{k}"))
        nodes.append(helper.make_node("MatMul", [f"x{k}" if k else "x", f"W{k}"], [f"x{k + 1}"]))
        nodes[-1].name = f"mm{k}"
    return _model(nodes, inits, f"x{weights}")


def _folded(readers: int) -> Analysis:
    """Each of ``readers`` MatMuls reads its own [C, C] tensor made by ``ConstantOfShape`` from an
    int64[2] shape: the file stores those 16 bytes, the compiler folds W per reader."""
    nodes = []
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    for k in range(readers):
        nodes.append(
            helper.make_node("ConstantOfShape", ["shape"], [f"c{k}"], f"make{k}", value=one)
        )
        nodes.append(helper.make_node("MatMul", [f"x{k}" if k else "x", f"c{k}"], [f"x{k + 1}"]))
        nodes[-1].name = f"mm{k}"
    shape = numpy_helper.from_array(np.array([C, C], np.int64), "shape")
    return _model(nodes, [shape], f"x{readers}")


def _proof(analysis: Analysis, memory: int, devices: int) -> PlanInfeasibleError | None:
    """What the planner concludes at ``MARGIN``: its proof, or None (a plan or an estimate)."""
    try:
        plan_stages(analysis, _target(memory), devices, safety_margin=MARGIN)
    except PlanInfeasibleError as proof:
        return proof
    except NoSplitError as estimate:
        assert not estimate.proven and estimate.exit_code == 5
    return None


@pytest.mark.parametrize("devices", [1, 2])
def test_one_nodes_weights_one_byte_over_a_device_is_the_proof_and_exactly_a_device_is_not(
    devices: int,
) -> None:
    analysis = _chain(devices)
    assert _proof(analysis, W, devices) is None  # they fit a device exactly: no proof at 1.5
    proof = _proof(analysis, W - 1, devices)
    assert proof is not None and proof.grounds == "node_weights" and proof.short_bytes == 1
    assert proof.node == "mm0" and proof.min_devices is None
    assert proof.message == (
        "the model does not fit on any number of edge devices: node 'mm0''s weights alone are "
        "16,384 B, more than one device's 16,383 B"  # one byte over: rounded, both read 16.00 KiB
    )
    assert proof.hint == "use a smaller model, a lower precision, or a target with more memory"


def test_the_distinct_weights_one_byte_over_the_devices_are_the_proof_and_exactly_them_not() -> (
    None
):
    """Three nodes of W on two devices of 1.5 W each: the weights fill them exactly (no proof;
    with the margin in the grounds it would be one), two bytes less is the proof."""
    analysis = _chain(3)
    assert analysis.folded_bytes == 0
    assert _proof(analysis, 3 * W // 2, 2) is None
    proof = _proof(analysis, 3 * W // 2 - 1, 2)
    assert proof is not None and proof.grounds == "weights_total"
    assert proof.short_bytes == 2 and proof.min_devices == 3
    assert (
        proof.hint == "rerun with --devices 3 (a lower bound: activations and code need room too)"
    )
    assert proof.reruns == ({"devices": 3},)
    assert "its distinct weights alone are 49,152 B, more than the 2 devices' 49,150 B" in (
        proof.message
    )
    far = _proof(analysis, W, 2)
    assert far is not None and "alone are 48.00 KiB, more than the 2 devices' 32.00 KiB" in (
        far.message
    )


def test_a_folded_constant_is_the_weight_of_the_node_that_reads_it() -> None:
    """The file's only initializers are int64 shapes and slice bounds; the folded [16, COLUMNS]
    tensor is whole on its reader's device when it runs, folded or not: one byte less than it is
    the proof, exactly it is not."""
    analysis = _folded(1)
    assert analysis.folded_bytes == W
    assert _proof(analysis, W, 1) is None
    proof = _proof(analysis, W - 1, 1)
    assert proof is not None and proof.grounds == "node_weights" and proof.node == "mm0"
    assert proof.short_bytes == 1


def test_folded_constants_are_not_weights_held_all_at_once() -> None:
    """Three folded tensors of W on two devices of 1.5 W minus a byte: were they stored weights it
    would be the proof (above); computed at run time they need not be held together, so it is not."""
    analysis = _folded(3)
    assert analysis.folded_bytes == 3 * W
    proof = weights_proof(analysis, _target(3 * W // 2 - 1), 2)
    assert proof is None


# --- the hints after "no fitting split found" (exit 5) --------------------------------------------


def test_the_hint_names_the_count_a_fitting_split_was_found_on_or_more_than_searched() -> None:
    from sharderd.plan.infeasible import fitting_hint

    hint, reruns = fitting_hint(4, 6, 12)
    assert hint.startswith("rerun with --devices 6 (the fewest on which the planner found")
    assert reruns == ({"devices": 6}, {"backend": "poprt"})
    hint, reruns = fitting_hint(4, None, 12)
    assert hint.startswith("no split fits the estimate on 5 to 12 devices either: rerun with more")
    assert reruns == ({"devices": 13}, {"backend": "poprt"})


def test_a_fitting_hint_keeps_everything_else_the_error_said() -> None:
    from sharderd.errors import NotProvenError
    from sharderd.plan.infeasible import with_fitting_hint

    err = NotProvenError("no split", hint="old", device=2, short_bytes=7, min_devices=9)
    err.fits_without_margin = True
    err.node, err.node_need, err.node_activation_share = "mm", 1.4, 0.25
    again = with_fitting_hint(err, 4, 6, 12)
    assert (again.message, again.device, again.short_bytes) == ("no split", 2, 7)
    assert (again.min_devices, again.fits_without_margin) == (6, True)
    assert (again.node, again.node_need, again.node_activation_share) == ("mm", 1.4, 0.25)
    assert again.hint is not None and again.hint.startswith("rerun with --devices 6")
    assert again.reruns == ({"devices": 6}, {"backend": "poprt"})


def test_an_overfull_plan_names_its_most_overfull_device_by_share_not_bytes() -> None:
    from types import SimpleNamespace

    from sharderd.plan.infeasible import overfull_not_proven

    stages = (
        SimpleNamespace(index=0, memory_bytes=3000, budget_bytes=2800),  # the most bytes, 7% over
        SimpleNamespace(index=1, memory_bytes=1200, budget_bytes=1000),  # 20% over
    )
    plan = SimpleNamespace(devices=2, stages=stages, safety_margin=1.15)
    err = overfull_not_proven(plan, _target(1000), 3, 8)  # type: ignore[arg-type]
    assert (err.device, err.short_bytes, err.min_devices, err.exit_code) == (1, 200, 3, 5)
    assert "puts 1.17 KiB on device 1, over its budget of 1000 B (margin 1.15)" in err.message
    assert err.hint is not None and err.hint.startswith("rerun with --devices 3")
