"""Real exporter outputs through the CLI and the daemon: dims given or refused, sharded, verified.

The models are tests/data/models (tiny configs of GPT-2, BERT, ViT, EfficientNet and an SD-style
U-Net exported by torch.onnx.export); `manifest.json` holds the shapes onnxruntime ran them at.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from sharderd.cli import main as cli_main
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file
from tests.daemon_helpers import drop, running, write_config

DATA = Path(__file__).resolve().parent.parent / "data" / "models"
MANIFEST: dict[str, dict[str, Any]] = json.loads((DATA / "manifest.json").read_text())
ORIGINAL_FIVE = ["tiny_bert", "tiny_efficientnet", "tiny_gpt2", "tiny_unet", "tiny_vit"]


def shape_flags(name: str) -> list[str]:
    """``--input-shape`` flags for the shapes the manifest ran the model at."""
    flags = []
    for inp, shape in MANIFEST[name]["ort_input_shapes"].items():
        flags += ["--input-shape", f"{inp}={','.join(map(str, shape))}"]
    return flags


def report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", ORIGINAL_FIVE)
def test_real_export_shards_and_verifies_on_onnxruntime(
    name: str, devices: int, tmp_path: Path
) -> None:
    """Every real export, at its manifest shapes: 0 unknown tensors, static shapes written, and the
    split stages compute what the original computes."""
    out = tmp_path / "out"
    model = DATA / MANIFEST[name]["path"]
    args = [
        "shard",
        str(model),
        "--devices",
        str(devices),
        "--backend",
        "onnxruntime",
        "-o",
        str(out),
        "-q",
    ]
    assert cli_main([*args, *shape_flags(name)]) == 0
    facts = report(out)
    assert facts["model"]["unknown_size_tensors"] == 0
    assert facts["status"] != "failed"
    written = onnx.load(str(out / "model.sharded.onnx"), load_external_data=False)
    for value in written.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims == MANIFEST[name]["ort_input_shapes"][value.name]
    assert facts["verification"]["passed"] is True
    assert set(facts["verification"]["outputs"]) == set(MANIFEST[name]["outputs"])


@pytest.mark.parametrize("command", ["plan", "shard"])
def test_missing_dims_are_exit_2_before_planning(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """BERT without a sequence length: exit 2 naming each dim and the flag; nothing planned or written."""
    out = tmp_path / "out"
    args = [command, str(DATA / "tiny_bert" / "model.onnx"), "--devices", "2"]
    if command == "shard":
        args += ["--backend", "onnxruntime", "-o", str(out)]
    assert cli_main(args) == 2
    captured = capsys.readouterr()
    for inp in ("input_ids", "attention_mask", "token_type_ids"):
        assert f"input {inp!r} axis 1 ('sequence')" in captured.err
    assert "--dim sequence=<size>" in captured.err
    assert "dims = { sequence = <size> }" in captured.err
    assert "plan.finished" not in captured.err and "attempt.started" not in captured.err
    assert not (out / "model.sharded.onnx").exists()
    # the flag, as the hint spells it, with a size: plans
    assert (
        cli_main(
            [
                "plan",
                str(DATA / "tiny_bert" / "model.onnx"),
                "--devices",
                "2",
                "--dim",
                "sequence=32",
            ]
        )
        == 0
    )


def test_fp16_halves_planned_weights_and_its_stages_verify_against_the_fp32_file(
    tmp_path: Path,
) -> None:
    name = "tiny_vit"
    model = DATA / name / "model.onnx"
    fp32 = analyze_file(model, PlanConfig())
    fp16 = analyze_file(model, PlanConfig(precision="fp16"))
    assert fp32.precision == "fp32" and fp16.precision == "fp16"
    assert fp16.total_weight_bytes == pytest.approx(fp32.total_weight_bytes / 2, rel=0.01)
    out = tmp_path / "out"
    args = [
        "shard",
        str(model),
        "--devices",
        "2",
        "--backend",
        "onnxruntime",
        "--precision",
        "fp16",
        "-o",
        str(out),
        "-q",
    ]
    assert cli_main(args) == 0
    written = onnx.load(str(out / "model.sharded.onnx"))
    kinds = {
        t.data_type
        for t in written.graph.initializer
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
    }
    assert kinds == {TensorProto.FLOAT16}
    assert [i.type.tensor_type.elem_type for i in written.graph.input] == [
        TensorProto.FLOAT
    ]  # io keeps its type
    assert all(
        {a.name for a in n.attribute} >= {"__ipu_number", "__pipeline_stage"}
        for n in written.graph.node
    )
    assert report(out)["verification"]["passed"] is True


def test_data_dependent_shape_is_listed_and_costed_at_its_bound(tmp_path: Path) -> None:
    """NonZero's output length depends on the data: the report names the node and says it was
    counted at its upper bound (every element nonzero), not as 0 bytes."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("NonZero", ["r"], ["nz"], name="nonzero"),
        helper.make_node("Transpose", ["nz"], ["idx"], name="transpose"),
        helper.make_node("GatherND", ["r", "idx"], ["picked"], name="gather"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "nz.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    analysis = analyze_file(path, PlanConfig())
    listed = {d.tensor: d for d in analysis.shapes.data_dependent}
    assert listed["nz"].node == "nonzero" and "upper bound [2, 32]" in listed["nz"].costed_as
    nz = analysis.flow.tensor_names.index("nz")
    assert analysis.costs.tensor_bytes[nz] == 2 * 32 * 8
    assert any("nonzero" in w and "data-dependent" in w for w in analysis.warnings)


def test_constants_made_by_constant_of_shape_count_as_weights() -> None:
    """The onnx package's light_resnet50 builds its 97.7 MiB of weights with ConstantOfShape."""
    light = (
        Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    )
    if not light.exists():
        pytest.skip("this onnx wheel ships no light models")
    analysis = analyze_file(light, PlanConfig(name_nodes=True))
    assert analysis.total_weight_bytes / 2**20 == pytest.approx(97.7, abs=0.1)
    assert analysis.folded_nodes >= 239


def test_inference_writes_nothing_even_when_it_cannot_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime's infer_shapes() dumps a model into the working directory when it is incomplete;
    sharderd drives the inference itself and writes nothing (a custom op stays unknown)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mystery", ["r"], ["y"], name="mystery", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    analysis = analyze_file(path, PlanConfig())
    assert list(work.iterdir()) == []
    assert analysis.costs.unknown_tensors == ("y",)


# --- the daemon ---------------------------------------------------------------------------------

pytestmark_daemon = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)


def _unnamed_copy(src: Path, dst: Path) -> None:
    model = onnx.load(str(src))
    for node in model.graph.node:
        node.name = ""
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


@pytestmark_daemon
def test_daemon_shards_dynamic_exports_with_sidecar_dims_and_refuses_one_without(
    tmp_path: Path,
) -> None:
    """GPT-2 with `dims` in its sidecar, BERT without nodes names but `name_nodes = true`: both shard
    at the given shapes; BERT without any dims fails with error.md naming the sidecar line."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(DATA / "tiny_gpt2" / "model.onnx", models / "gpt2.onnx")
    (models / "gpt2.toml").write_text("dims = { sequence = 64 }\n")
    _unnamed_copy(DATA / "tiny_bert" / "model.onnx", models / "bert.onnx")
    (models / "bert.toml").write_text(
        'name_nodes = true\ninput_shapes = { input_ids = [1, 32], attention_mask = [1, 32], token_type_ids = [1, 32] }\nprecision = "fp32"\n'
    )
    shutil.copy(DATA / "tiny_bert" / "model.onnx", models / "nodims.onnx")
    with running(write_config(tmp_path)) as daemon:
        for name in ("gpt2.toml", "gpt2.onnx", "bert.toml", "bert.onnx", "nodims.onnx"):
            drop(models / name, tmp_path / "inbox")
        daemon.wait_for("job.succeeded", name="gpt2")
        daemon.wait_for("job.succeeded", name="bert")
        daemon.wait_for("job.failed", name="nodims")
    gpt2 = report(tmp_path / "outbox" / "gpt2")
    assert gpt2["model"]["resolved_dims"] == {"batch": 1, "sequence": 64}
    assert gpt2["model"]["unknown_size_tensors"] == 0
    bert = report(tmp_path / "outbox" / "bert")
    assert bert["model"]["resolved_dims"]["sequence"] == 32
    written = onnx.load(
        str(tmp_path / "outbox" / "bert" / "bert.sharded.onnx"), load_external_data=False
    )
    assert all(n.name for n in written.graph.node)
    failed = tmp_path / "state" / "failed" / "nodims"
    error = json.loads((failed / "error.json").read_text())
    assert error["reason"] == "unresolved_dims"
    readable = (failed / "error.md").read_text()
    assert "input 'input_ids' axis 1 ('sequence')" in readable
    assert "dims = { sequence = <size> }" in readable
    assert not (tmp_path / "outbox" / "nodims").exists()


def test_sidecar_plan_keys_are_validated_with_the_plan_rules(tmp_path: Path) -> None:
    from sharderd.config import DaemonConfig
    from sharderd.daemon.sidecar import load_sidecar
    from sharderd.errors import ConfigError

    path = tmp_path / "m.toml"
    path.write_text("dims = { sequence = 0 }\n")
    with pytest.raises(ConfigError, match=r"sidecar m\.toml: .*sequence.* must be an integer >= 1"):
        load_sidecar(path, DaemonConfig())
    path.write_text('precision = "int8"\n')
    with pytest.raises(ConfigError, match="precision: 'int8' is not one of"):
        load_sidecar(path, DaemonConfig())
    path.write_text("dims = { sequence = 16 }\nbatch_size = 2\n")
    options = load_sidecar(path, DaemonConfig())
    plan = options.plan_config(PlanConfig(dims={"other": 3}))
    assert dict(plan.dims) == {"other": 3, "sequence": 16} and plan.batch_size == 2


def test_a_fault_in_writing_the_sharded_model_fails_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The production path compares the stages with the user's own file: a writer that changes one
    weight (a bug in annotate or write) is caught, exit 1, 'verification failed'."""
    import onnx.numpy_helper

    from sharderd import engine

    real_write = engine.write_model

    def corrupting_write(model: onnx.ModelProto, path: Path) -> None:
        biggest = max(model.graph.initializer, key=lambda t: len(t.raw_data))
        value = onnx.numpy_helper.to_array(biggest).copy()
        value.flat[0] += 1.0
        biggest.CopyFrom(onnx.numpy_helper.from_array(value, biggest.name))
        real_write(model, path)

    monkeypatch.setattr(engine, "write_model", corrupting_write)
    out = tmp_path / "out"
    args = [
        "shard",
        str(DATA / "tiny_vit" / "model.onnx"),
        "--devices",
        "2",
        "--backend",
        "onnxruntime",
    ]
    assert cli_main([*args, "-o", str(out)]) == 1
    assert "verification failed" in capsys.readouterr().err
