"""PopART's matmul serialization in the written model: ``__serialize_matmul_mode`` (STRING) and
``__serialize_matmul_factor`` (INT) on the named MatMuls only, bodies included, through the planning
worker's codec, on a probe's one-node model too."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from shard.test_amp import staged

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file
from sharderd.job.session import (
    PlanRequest,
    PlanService,
    ProbeRequest,
    plan_request_from,
    probe_request_from,
)
from sharderd.plan.bounds import memory_floor
from sharderd.shard.amp import set_stage_amps
from sharderd.shard.matmul_serial import (
    FACTOR_ATTR,
    MODE_ATTR,
    node_serialization,
    set_serialization,
)
from sharderd.target import BUILTIN_TARGETS

TINY_BERT = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_bert" / "model.onnx"


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_only_the_named_matmuls_get_the_two_attributes_as_popart_reads_them() -> None:
    model = staged([0, 0, 1])
    set_stage_amps(model, (None, 0.2))
    assert set_serialization(model, {"MatMul_1": 4, "Relu_1": 4, "absent": 2}) == 1
    assert node_serialization(model.graph) == {"MatMul_1": 4}
    attrs = {a.name: a for a in model.graph.node[2].attribute}
    assert attrs[MODE_ATTR].type == onnx.AttributeProto.STRING
    assert attrs[MODE_ATTR].s == b"output_channels"
    assert attrs[FACTOR_ATTR].type == onnx.AttributeProto.INT and attrs[FACTOR_ATTR].i == 4
    assert "__available_memory" not in attrs  # stage 0: the other attributes are left as they were
    assert "__available_memory" in _attrs(model.graph.node[4])
    set_serialization(model, {"MatMul_1": 8})  # again: replaced, never doubled
    assert [a.name for a in model.graph.node[2].attribute].count(FACTOR_ATTR) == 1
    assert node_serialization(model.graph) == {"MatMul_1": 8}


def test_a_matmul_in_an_if_body_is_found_by_its_name() -> None:
    inner = helper.make_node("MatMul", ["x", "w"], ["y"], name="Inner")
    body = helper.make_graph(
        [inner], "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"], name="Other")],
        "else",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])],
    )
    node = helper.make_node(
        "If", ["c"], ["out"], name="Branch", then_branch=body, else_branch=other
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((4, 4), np.float32), "w")],
    )
    model = helper.make_model(graph)
    assert set_serialization(model, {"Inner": 2, "Branch": 2}) == 1  # the If itself is no MatMul
    assert node_serialization(model.graph) == {"Inner": 2}
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    assert _attrs(then.node[0])[FACTOR_ATTR] == 2


def test_a_plan_request_writes_its_serialization_through_the_worker_codec(tmp_path: Path) -> None:
    """``PlanRequest.matmul_serialization`` survives the worker's JSON, lands on that node of a
    real export and nowhere else, and changes nothing of the split."""
    service = PlanService(TINY_BERT, PlanConfig(dims={"sequence": 32}), BUILTIN_TARGETS["ipu-mk2"])
    plain = service.plan(PlanRequest(2, 1.0, write_dir=str(tmp_path / "b")))
    assert plain.files is not None
    written = onnx.load(plain.files.model, load_external_data=False)
    name = next(n.name for n in written.graph.node if n.op_type == "MatMul")
    request = PlanRequest(2, 1.0, write_dir=str(tmp_path / "a"), matmul_serialization=((name, 4),))
    decoded = plan_request_from(json.loads(json.dumps({"op": "plan", **asdict(request)})))
    assert decoded == request
    planned = service.plan(decoded)
    assert planned.plan.digest == plain.plan.digest and planned.files is not None
    model = onnx.load(planned.files.model, load_external_data=False)
    assert node_serialization(model.graph) == {name: 4}
    assert node_serialization(written.graph) == {}


def test_the_probe_is_written_serialized_when_asked_and_says_its_factor(tmp_path: Path) -> None:
    """The tail MatMul of ``tiled_tail`` (64 output channels) needs most of a device whose
    memory is its floor / 0.7: it is the probe, retried ×16, and written so when asked."""
    path = tmp_path / "tail.onnx"
    onnx.save(examples.tiled_tail(hidden=256, rows=256, out=64), path)
    config = PlanConfig()
    mk2 = BUILTIN_TARGETS["ipu-mk2"]
    floor = memory_floor(analyze_file(path, config), mk2).node_bytes.max()
    service = PlanService(path, config, replace(mk2, memory_bytes=int(floor / 0.7)))
    found = service.probe(ProbeRequest(str(tmp_path / "plain.onnx")))
    assert found is not None and (found.name, found.serial_factor) == ("MatMul_b", 16)
    assert node_serialization(onnx.load(found.model).graph) == {}
    request = ProbeRequest(str(tmp_path / "serial.onnx"), ((found.name, 16),))
    assert probe_request_from(json.loads(json.dumps(asdict(request)))) == request
    serial = service.probe(request)
    assert serial is not None and serial.name == found.name
    assert node_serialization(onnx.load(serial.model).graph) == {"MatMul_b": 16}
