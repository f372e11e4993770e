"""Per-stage AMP in the written model: ``__available_memory`` on that stage's conv/matmul nodes
only, in the YAML's header, and put back by name after a conversion that dropped it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.shard.amp import AMP_ATTR, node_amps, set_stage_amps, stage_amps_of
from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR
from sharderd.shard.poprt_config import manual_sharding_yaml
from sharderd.shard.reannotate import reapply_annotation


def staged(stages: list[int]) -> onnx.ModelProto:
    """x → (MatMul_k, Relu_k) per entry of ``stages``, both nodes on that stage."""
    nodes, inits, prev = [], [], "x"
    for k, stage in enumerate(stages):
        inits.append(numpy_helper.from_array(np.ones((4, 4), np.float32), f"w{k}"))
        for node in (
            helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"MatMul_{k}"),
            helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"Relu_{k}"),
        ):
            node.attribute.extend(
                [helper.make_attribute(IPU_ATTR, stage), helper.make_attribute(STAGE_ATTR, stage)]
            )
            nodes.append(node)
        prev = f"r{k}"
    graph = helper.make_graph(
        nodes,
        "staged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_only_the_conv_matmul_nodes_of_the_given_stages_get_the_attribute() -> None:
    model = staged([0, 0, 1, 2])
    assert set_stage_amps(model, (None, 0.3, 0.1)) == 2
    assert node_amps(model.graph) == pytest.approx({"MatMul_2": 0.3, "MatMul_3": 0.1})
    attr = next(a for a in model.graph.node[4].attribute if a.name == AMP_ATTR)
    assert attr.type == onnx.AttributeProto.FLOAT  # PopART reads it as FLOAT
    assert stage_amps_of(model.graph) == pytest.approx({1: 0.3, 2: 0.1})


def test_setting_again_replaces_the_value_and_nothing_leaves_the_model_as_it_was() -> None:
    model = staged([0, 1])
    set_stage_amps(model, (None, 0.3))
    set_stage_amps(model, (None, 0.1))
    assert [a.name for a in model.graph.node[2].attribute].count(AMP_ATTR) == 1
    assert node_amps(model.graph) == pytest.approx({"MatMul_1": 0.1})
    plain = staged([0, 1])
    assert set_stage_amps(plain, ()) == 0 and node_amps(plain.graph) == {}


def test_the_yaml_header_names_the_stages_with_their_own_amp() -> None:
    model = staged([0, 1, 2])
    set_stage_amps(model, (None, 0.25, None))
    text = manual_sharding_yaml(model)
    header = [line for line in text.splitlines() if line.startswith("# stage")]
    assert header == [
        f"# stage 1: available_memory_proportion 0.25 on its conv/matmul nodes ({AMP_ATTR} in the sharded model)"
    ]
    assert "# stage" not in manual_sharding_yaml(staged([0, 1]))


def test_reannotation_after_a_conversion_puts_the_amp_back_by_name() -> None:
    """A converter that drops every ``__`` attribute and adds a MatMul under a new name: the
    named nodes get their AMP back, the new MatMul its stage's, the Relus none."""
    model = staged([0, 1])
    set_stage_amps(model, (None, 0.2))
    planned = {
        n.name: {a.name: a.i for a in n.attribute if a.name in (IPU_ATTR, STAGE_ATTR)}
        for n in model.graph.node
    }
    amps = node_amps(model.graph)
    original = set(planned)
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    for node in converted.graph.node:
        kept = [a for a in node.attribute if not a.name.startswith("__")]
        del node.attribute[:]
        node.attribute.extend(kept)
    converted.graph.initializer.append(numpy_helper.from_array(np.ones((4, 4), np.float32), "w9"))
    converted.graph.node.append(helper.make_node("MatMul", ["r1", "w9"], ["fused"], name="Fused"))
    converted.graph.output[0].name = "fused"
    reapply_annotation(converted, planned, original, amps)
    assert node_amps(converted.graph) == pytest.approx({"MatMul_1": 0.2, "Fused": 0.2})
    assert stage_amps_of(converted.graph) == pytest.approx({1: 0.2})
    # without amps nothing is invented
    bare = onnx.ModelProto()
    bare.CopyFrom(converted)
    for node in bare.graph.node:
        kept = [a for a in node.attribute if a.name != AMP_ATTR]
        del node.attribute[:]
        node.attribute.extend(kept)
    reapply_annotation(bare, planned, original)
    assert node_amps(bare.graph) == {}


def test_a_plan_request_writes_its_stage_amps_through_the_worker_codec(tmp_path: Path) -> None:
    """``PlanRequest.stage_amps`` survives the planning worker's JSON and is written on every
    MatMul/Gemm of that stage of a real export, none elsewhere; the split does not change."""
    import json
    from dataclasses import asdict

    from sharderd.config import PlanConfig
    from sharderd.job.session import PlanRequest, PlanService, plan_request_from
    from sharderd.target import BUILTIN_TARGETS

    service = PlanService(
        Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_bert" / "model.onnx",
        PlanConfig(dims={"sequence": 32}),
        BUILTIN_TARGETS["ipu-mk2"],
    )
    request = PlanRequest(2, 1.0, write_dir=str(tmp_path / "a"), stage_amps=(None, 0.2))
    decoded = plan_request_from(json.loads(json.dumps({"op": "plan", **asdict(request)})))
    assert decoded == request
    planned = service.plan(decoded)
    plain = service.plan(PlanRequest(2, 1.0, write_dir=str(tmp_path / "b")))
    assert planned.plan.digest == plain.plan.digest
    assert planned.files is not None and plain.files is not None
    model = onnx.load(planned.files.model, load_external_data=False)
    matmuls = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm")]
    on_1 = {n.name for n in matmuls if any(a.name == STAGE_ATTR and a.i == 1 for a in n.attribute)}
    assert on_1 and len(on_1) < len(matmuls)
    assert node_amps(model.graph) == pytest.approx(dict.fromkeys(on_1, 0.2))
    assert "# stage 1: available_memory_proportion 0.2" in planned.files.sharding_yaml.read_text()
    written = onnx.load(plain.files.model, load_external_data=False)
    assert node_amps(written.graph) == {}
