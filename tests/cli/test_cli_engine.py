"""The engine through its CLI on real files: plans that fit and balance, proofs that a model does not
fit, and the command-line contract (files written, exit codes, stderr, report.json)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.cli import main as cli_main
from sharderd.config import PlanConfig, load_config
from sharderd.engine import analyze_file, make_plan
from sharderd.errors import (
    EXIT_BAD_INPUT,
    EXIT_DOES_NOT_FIT,
    EXIT_NOT_PROVEN,
    NoSplitError,
    NotProvenError,
    PlanInfeasibleError,
)
from sharderd.report.build import SCHEMA
from sharderd.shard.annotate import STAGE_ATTR

MODELS = ["transformer", "cnn", "shared_weights", "with_if", "multi_io", "chain"]
Run = Callable[..., subprocess.CompletedProcess[str]]


def _error_block(stderr: str) -> str:
    """The error message ending stderr (progress lines may precede it); never a traceback."""
    assert "Traceback" not in stderr, stderr
    _, sep, block = stderr.partition("sharderd: error: ")
    assert sep, f"no error message on stderr: {stderr!r}"
    assert len(block.strip().splitlines()) <= 3, block
    return block


# --- reading stages back from the file -------------------------------------------------------------


def _tensor_bytes(t: onnx.TensorProto) -> int:
    return (
        int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    )


def _stage(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == STAGE_ATTR)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _private_bytes(node: onnx.NodeProto) -> int:
    """Bytes a node carries itself: a Constant's value, initializers and Constants in its bodies."""
    if node.op_type == "Constant":
        return sum(
            _tensor_bytes(a.t) for a in node.attribute if a.type == onnx.AttributeProto.TENSOR
        )
    total = 0
    for body in _subgraphs(node):
        total += sum(_tensor_bytes(t) for t in body.initializer)
        total += sum(_private_bytes(inner) for inner in body.node)
    return total


def _reads(node: onnx.NodeProto) -> set[str]:
    names = {x for x in node.input if x}
    for body in _subgraphs(node):
        for inner in body.node:
            names |= _reads(inner)
    return names


def _stage_weights_from_file(model: onnx.ModelProto) -> dict[int, int]:
    """Per stage: each distinct initializer its nodes read, once, plus node-private weights."""
    sizes = {t.name: _tensor_bytes(t) for t in model.graph.initializer}
    used: dict[int, set[str]] = {}
    private: dict[int, int] = {}
    for node in model.graph.node:
        s = _stage(node)
        used.setdefault(s, set()).update(_reads(node) & sizes.keys())
        private[s] = private.get(s, 0) + _private_bytes(node)
    return {s: sum(sizes[n] for n in used[s]) + private[s] for s in used}


def _cut_tensors_from_file(model: onnx.ModelProto) -> dict[int, set[str]]:
    """Cut c: tensors produced on a stage < c and read on a stage >= c (routed names mapped back)."""
    graph = model.graph
    back = {n.output[0]: n.input[0] for n in graph.node if n.name.startswith("sharderd/route/")}
    produced = {out: _stage(n) for n in graph.node for out in n.output}
    last_read: dict[str, int] = {}
    for node in graph.node:
        for name in _reads(node):
            if name in produced:
                last_read[name] = max(last_read.get(name, -1), _stage(node))
    cuts: dict[int, set[str]] = {}
    for name, p in produced.items():
        for c in range(p + 1, last_read.get(name, -1) + 1):
            cuts.setdefault(c, set()).add(back.get(name, name))
    return cuts


# --- plans on real models ----------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [2, 3, 5])
@pytest.mark.parametrize("kind", MODELS)
def test_every_stage_has_work_and_fits(
    kind: str, devices: int, model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """Each stage is non-empty, has FLOPs or weights, fits capacity × margin; weights match the file."""
    result = shard(model_path(kind), devices)
    plan = result.report["plan"]
    stages = plan["stages"]
    assert [s["index"] for s in stages] == list(range(devices))
    assert sum(s["num_nodes"] for s in stages) == result.report["model"]["nodes"]
    for s in stages:
        assert s["num_nodes"] > 0
        assert s["flops"] > 0 or s["weight_bytes"] > 0, s
        assert s["memory_bytes"] == s["weight_bytes"] + s["activation_bytes"] + s["code_bytes"]
        assert s["memory_bytes"] * plan["safety_margin"] <= s["capacity_bytes"]
        assert s["time_s"] == pytest.approx(s["compute_s"] + s["comm_s"])
    weights = _stage_weights_from_file(result.model)
    assert [s["weight_bytes"] for s in stages] == [weights[i] for i in range(devices)]
    assert plan["bottleneck_s"] == pytest.approx(max(s["time_s"] for s in stages))
    assert plan["bottleneck_s"] >= plan["lower_bound_s"] * (1 - 1e-9)
    assert plan["ratio_to_bound"] == pytest.approx(plan["bottleneck_s"] / plan["lower_bound_s"])


def test_shared_weight_counts_on_every_stage_that_uses_it(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """W_shared, read on two stages, is in both stages' weight bytes (hand-computed from the file)."""
    path = model_path("shared_weights", hidden=64)
    result = shard(path, 2)
    model = result.model
    shared = next(t for t in model.graph.initializer if t.name == "W_shared")
    stages = {_stage(n) for n in model.graph.node if "W_shared" in n.input}
    assert stages == {0, 1}
    sizes = {t.name: _tensor_bytes(t) for t in model.graph.initializer}
    for s, stage in enumerate(result.report["plan"]["stages"]):
        names = {x for n in model.graph.node if _stage(n) == s for x in n.input if x in sizes}
        assert "W_shared" in names
        assert stage["weight_bytes"] == sum(sizes[x] for x in names)
    total = sum(s["weight_bytes"] for s in result.report["plan"]["stages"])
    assert total == result.report["model"]["weight_bytes"] + _tensor_bytes(shared)


def test_tied_embedding_counts_on_first_and_last_stage(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """The tied embedding read by the first Gather and the final Transpose counts on both ends."""
    result = shard(model_path("transformer", tied_embeddings=True), 3)
    name = "embeddings.word_embeddings.weight"
    readers = {_stage(n) for n in result.model.graph.node if name in n.input}
    assert readers == {0, 2}
    weights = _stage_weights_from_file(result.model)
    assert [s["weight_bytes"] for s in result.report["plan"]["stages"]] == [
        weights[i] for i in range(3)
    ]


def test_cut_tensors_match_the_file(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """report.json's cut tensors are exactly those crossing each stage boundary in the written model."""
    result = shard(model_path("transformer", layers=4), 4)
    plan = result.report["plan"]
    listed = {cut["cut"]: {t["name"] for t in cut["tensors"]} for cut in plan["cuts"]}
    assert listed == _cut_tensors_from_file(result.model)
    for cut in plan["cuts"]:
        assert cut["bytes"] == sum(t["bytes"] for t in cut["tensors"]) > 0
        assert plan["stages"][cut["cut"]]["recv_bytes"] == cut["bytes"]
        assert plan["stages"][cut["cut"] - 1]["send_bytes"] == cut["bytes"]


# --- models that do not fit ----------------------------------------------------------------------------

_TINY = 3_000_000
"""Bytes per device of the custom target: the 4-layer transformer below needs 5 of them."""


def _tiny_config(tmp_path: Path, memory: int = _TINY, extra: str = "") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(f'[targets.tiny]\nbase = "ipu-mk2"\nmemory_bytes = {memory}\n{extra}')
    return path


def _fat_transformer(model_path: Callable[..., Path]) -> Path:
    return model_path("transformer", "fat.onnx", layers=4, hidden=64, heads=4, seq=16, vocab=200)


_WEIGHTS_OVER_TWO = 400_000
"""Bytes per device under which the transformer's distinct weights (~0.9 MB) exceed 2 devices."""


def test_infeasible_plan_names_device_shortfall_and_min_devices(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """The distinct weights alone over 2 devices together: a proof (exit 3, ``weights_total``) that
    says by how much and how many devices the weights need."""
    config = load_config(_tiny_config(tmp_path, memory=_WEIGHTS_OVER_TWO))
    target = config.target("tiny")
    analysis = analyze_file(_fat_transformer(model_path), PlanConfig())
    with pytest.raises(PlanInfeasibleError) as info:
        make_plan(analysis, target, 2, config.plan)
    err = info.value
    weights = analysis.total_weight_bytes
    assert err.grounds == "weights_total" and err.proven
    assert err.short_bytes == weights - 2 * _WEIGHTS_OVER_TWO
    assert err.min_devices == math.ceil(weights / _WEIGHTS_OVER_TWO)
    message = str(err)
    assert "tiny" in message and "distinct weights alone" in message
    assert f"--devices {err.min_devices}" in message
    # the proof counts weights only: one device more than they need is no proof
    try:
        make_plan(analysis, target, err.min_devices, config.plan)
    except NoSplitError as other:
        assert not isinstance(other, PlanInfeasibleError)


def test_an_estimate_over_the_devices_is_not_a_proof(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """Weights and code × margin over 2 devices, the weights alone not: exit 5's error, naming
    the device count the estimate suggests, and that many devices plan within memory."""
    config = load_config(_tiny_config(tmp_path))
    target = config.target("tiny")
    analysis = analyze_file(_fat_transformer(model_path), PlanConfig())
    with pytest.raises(NotProvenError) as info:
        make_plan(analysis, target, 2, config.plan)
    err = info.value
    assert err.exit_code == 5 and not err.proven and err.grounds is None
    assert err.min_devices is not None and err.min_devices > 2
    assert "not proven" in str(err) and f"--devices {err.min_devices}" in str(err)
    plan = make_plan(analysis, target, err.min_devices, config.plan)
    assert all(s.memory_bytes * config.plan.safety_margin <= _TINY for s in plan.stages)


def _one_big_node_model() -> onnx.ModelProto:
    """Small MatMuls around one 1 MiB MatMul that no tiny device can hold."""
    f = TensorProto.FLOAT
    weights = [
        numpy_helper.from_array(np.full((16, 16), 0.01, np.float32), "W_a"),
        numpy_helper.from_array(np.full((16, 16384), 0.01, np.float32), "W_big"),
        numpy_helper.from_array(np.full((1, 4), 0.01, np.float32), "W_c"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W_a"], ["a"], name="/a/MatMul"),
        helper.make_node("MatMul", ["a", "W_big"], ["b"], name="/big/MatMul"),
        helper.make_node("ReduceSum", ["b"], ["r"], name="/c/ReduceSum", keepdims=1),
        helper.make_node("MatMul", ["r", "W_c"], ["y"], name="/c/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "big_node",
        [helper.make_tensor_value_info("x", f, [1, 16])],
        [helper.make_tensor_value_info("y", f, [1, 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_node_larger_than_a_device_has_no_device_count(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """One node over a device's memory: min_devices is None and the message names that node."""
    config = load_config(_tiny_config(tmp_path, memory=600_000, extra="code_bytes_per_node = 0\n"))
    analysis = analyze_file(model_path(_one_big_node_model()), PlanConfig())
    for devices in (1, 4):
        with pytest.raises(PlanInfeasibleError) as info:
            make_plan(analysis, config.target("tiny"), devices, config.plan)
        assert info.value.min_devices is None
        assert "'/big/MatMul'" in str(info.value)
        assert info.value.short_bytes is not None and info.value.short_bytes > 0


def test_plan_exits_3_only_on_the_weights_and_5_on_the_estimate(
    model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """`sharderd plan` (no compile): the weights alone over the devices is exit 3; weights and
    code × margin over them, the weights alone not, is exit 5 ("not proven")."""
    for memory, code in ((_WEIGHTS_OVER_TWO, EXIT_DOES_NOT_FIT), (_TINY, EXIT_NOT_PROVEN)):
        config = _tiny_config(tmp_path, memory=memory)
        proc = run_cli("plan", _fat_transformer(model_path), "-n", "2", "-c", config, "-t", "tiny")
        assert proc.returncode == code, proc.stderr
        assert ("not proven" in proc.stderr) is (code == EXIT_NOT_PROVEN)


def test_cli_exit_3_when_the_model_does_not_fit(
    model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """`sharderd shard` where the weights alone exceed the devices exits 3, says why on stderr, and
    writes no model; where only the estimate does, it exits 5 and says it is not proven. Either way
    report.json in the output folder records the verdict and the error."""
    for memory, code, opening in (
        (_WEIGHTS_OVER_TWO, EXIT_DOES_NOT_FIT, "the model does not fit on 2 × tiny"),
        (_TINY, EXIT_NOT_PROVEN, "no fitting split found on 2 × tiny (not proven)"),
    ):
        out = tmp_path / f"out{memory}"
        proc = run_cli(
            "shard",
            _fat_transformer(model_path),
            "-n",
            "2",
            "-b",
            "none",
            "-c",
            _tiny_config(tmp_path, memory=memory),
            "-t",
            "tiny",
            "-o",
            out,
        )
        assert proc.returncode == code, proc.stderr
        block = _error_block(proc.stderr)
        assert block.startswith(opening) and "--devices" in block
        assert not any(out.glob("*.sharded.onnx"))
        report = json.loads((out / "report.json").read_text())
        assert report["verdict"]["proven"] is (code == EXIT_DOES_NOT_FIT)
        assert report["error"]["message"].startswith(opening)
        assert f"{out}/report.md" in proc.stderr


# --- the command-line contract --------------------------------------------------------------------------


def _listing(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_plan_prints_and_writes_nothing(
    model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """`sharderd plan` prints the stage table and leaves the folder (cwd and model folder) unchanged."""
    path = model_path("transformer")
    before = _listing(tmp_path)
    proc = run_cli("plan", path, "--devices", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "## Plan: 2 stage(s)" in proc.stdout and "| stage |" in proc.stdout
    assert _listing(tmp_path) == before


def test_plan_json_is_the_versioned_report(
    model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """`sharderd plan --json` prints one JSON document with the report schema; it writes nothing."""
    path = model_path("cnn")
    before = _listing(tmp_path)
    proc = run_cli("plan", path, "--devices", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == SCHEMA == "sharderd.report/3"
    assert report["plan"]["devices"] == 3 and len(report["plan"]["stages"]) == 3
    assert _listing(tmp_path) == before


def test_shard_writes_exactly_four_files_into_the_default_folder(
    model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """Without --out, `sharderd shard` writes ./<stem>.sharded/ with the four files, nothing else."""
    path = model_path("multi_io")
    work = tmp_path / "work"
    work.mkdir()
    models_before = _listing(path.parent)
    proc = run_cli("shard", path, "--devices", "2", "--backend", "none", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert sorted(_listing(work)) == sorted(
        f"multi_io.sharded/{name}"
        for name in (
            "multi_io.sharded.onnx",
            "multi_io.sharding.yaml",
            "report.html",
            "report.json",
            "report.md",
        )
    )
    assert _listing(path.parent) == models_before
    model = onnx.load(
        str(work / "multi_io.sharded" / "multi_io.sharded.onnx"), load_external_data=False
    )
    assert {_stage(n) for n in model.graph.node} == {0, 1}


def test_shard_out_dir(
    model_path: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out DIR receives the four files; the printed summary names the folder."""
    out = tmp_path / "deep" / "er"
    assert (
        cli_main(["shard", str(model_path("chain")), "-n", "3", "-b", "none", "--out", str(out)])
        == 0
    )
    assert sorted(_listing(out)) == [
        "chain.sharded.onnx",
        "chain.sharding.yaml",
        "report.html",
        "report.json",
        "report.md",
    ]
    assert f"wrote {out}/" in capsys.readouterr().out


def test_external_data_is_copied_and_the_sharded_model_runs(
    model_path: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The data file lands next to the sharded model, which onnxruntime runs to the original's outputs
    at the batch it was planned for (the sharded model's shapes are static)."""
    path = model_path("transformer", external_data=True)
    out = tmp_path / "out"
    args = [
        "shard",
        str(path),
        "-n",
        "3",
        "-b",
        "none",
        "--batch-size",
        "2",
        "--out",
        str(out),
        "--json",
    ]
    assert cli_main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(_listing(out)) == sorted(
        [
            "transformer.data",
            "transformer.sharded.onnx",
            "transformer.sharding.yaml",
            "report.html",
            "report.json",
            "report.md",
        ]
    )
    assert report["outputs"]["external_data"] == ["transformer.data"]
    assert (out / "transformer.data").read_bytes() == path.with_name(
        "transformer.data"
    ).read_bytes()
    sharded = onnx.load(str(out / "transformer.sharded.onnx"))  # with its external data
    original = onnx.load(str(path))
    for a, b in zip(original.graph.initializer, sharded.graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))

    rng = np.random.default_rng(3)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    feeds = {"input_ids": rng.integers(0, 50, (2, 8), dtype=np.int64), "attention_mask": mask}
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(
        str(out / "transformer.sharded.onnx"), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    assert len(got) == len(expected) == 1
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-6)
    assert np.abs(expected[0]).max() > 0


def _bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text("[plan]\nbatchsize = 2\n")
    return path


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("corrupt", "looks incomplete: the file ends inside"),  # a 100-byte prefix of a model
        ("unnamed", "--name-nodes"),
        ("unknown-target", "unknown target 'nope'"),
        ("bad-config-key", "unknown key 'batchsize'"),
    ],
)
def test_bad_input_exits_2_with_a_short_message(
    case: str, needle: str, model_path: Callable[..., Path], tmp_path: Path, run_cli: Run
) -> None:
    """Bad model, unnamed nodes, unknown target or config key: exit 2, a short stderr, no traceback."""
    path = model_path("shared_weights", layers=3)
    args: list[Any] = ["shard", path, "--devices", "2", "--backend", "none"]
    if case == "corrupt":
        path.write_bytes(path.read_bytes()[:100])
    elif case == "unnamed":
        args[1] = model_path("shared_weights", "unnamed.onnx", layers=3, name_nodes=False)
    elif case == "unknown-target":
        args += ["--target", "nope"]
    else:
        args += ["--config", _bad_config(tmp_path)]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert needle in _error_block(proc.stderr)
    assert proc.stdout == ""
    assert not list(tmp_path.glob("*.sharded"))


def test_name_nodes_flag_makes_unnamed_model_shard(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same unnamed model shards with --name-nodes, and the report counts the renamed nodes."""
    path = model_path("shared_weights", layers=3, name_nodes=False)
    out = tmp_path / "out"
    assert (
        cli_main(
            ["shard", str(path), "-n", "2", "-b", "none", "--name-nodes", "-o", str(out), "-q"]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["renamed_nodes"] == len(onnx.load(str(path)).graph.node)
    assert "renamed" in (out / "report.md").read_text()


def test_example_model_writes_a_model_that_shards(tmp_path: Path, run_cli: Run) -> None:
    """`sharderd example-model` writes a model; `sharderd shard` on it exits 0 with a sharded model."""
    proc = run_cli("example-model", "transformer", "--set", "layers=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "example-transformer.onnx"
    assert proc.stdout.strip() == path.name and path.is_file()
    proc = run_cli(
        "shard", path.name, "--devices", "2", "--backend", "none", "--quiet", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    model = onnx.load(
        str(tmp_path / "example-transformer.sharded" / "example-transformer.sharded.onnx")
    )
    assert {_stage(n) for n in model.graph.node} == {0, 1}


def test_report_json_holds_the_plan_facts(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """report.json: status not_compiled, model sha256, per-stage costs vs capacity, cuts, bound, timings."""
    path = model_path("transformer", layers=3)
    result = shard(path, 3)
    report = result.report
    assert report["schema"] == "sharderd.report/3"
    assert report["status"] == "not_compiled" and report["backend"] == "none"
    assert report["model"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert report["model"]["nodes"] == len(onnx.load(str(path)).graph.node)
    assert report["target"]["name"] == "ipu-mk2"
    assert isinstance(report["warnings"], list)
    plan = report["plan"]
    for stage in plan["stages"]:
        for key in (
            "weight_bytes",
            "activation_bytes",
            "flops",
            "time_s",
            "memory_bytes",
            "capacity_bytes",
            "budget_bytes",
        ):
            assert isinstance(stage[key], int | float) and stage[key] >= 0, key
        assert stage["capacity_bytes"] == report["target"]["memory_bytes"]
        assert stage["budget_bytes"] == int(stage["capacity_bytes"] / plan["safety_margin"])
        assert stage["activation_bytes"] > 0 and stage["time_s"] > 0
    assert len(plan["cuts"]) == 2 and all(c["tensors"] for c in plan["cuts"])
    assert plan["slowest_stage"] == max(range(3), key=lambda s: plan["stages"][s]["time_s"])
    assert 0 < plan["lower_bound_s"] <= plan["bottleneck_s"]
    assert plan["ratio_to_bound"] >= 1.0
    assert plan["planner"]["probes"] >= 1
    assert plan["planner"]["timings_s"]["total"] > 0
    assert set(plan["orders_tried"]) >= {plan["order"]}
    assert report["outputs"]["model"] == "transformer.sharded.onnx"
    md = (result.out / "report.md").read_text()
    assert "not_compiled" in md and report["model"]["sha256"][:16] in md


@pytest.mark.parametrize("option", [["--batch-size", "0"], ["--safety-margin", "0.5"]])
def test_out_of_range_overrides_exit_2(
    option: list[str], model_path: Callable[..., Path], run_cli: Run
) -> None:
    """--batch-size 0 or --safety-margin below 1 is bad usage: exit 2 with a message naming the option."""
    proc = run_cli("plan", model_path("chain"), "--devices", "2", *option)
    assert proc.returncode == EXIT_BAD_INPUT
    assert option[0].removeprefix("--").replace("-", "_") in _error_block(proc.stderr)


def _feeds(model: onnx.ModelProto, sign: float) -> dict[str, np.ndarray]:
    """Inputs for the examples; ``sign`` flips with_if's branch (its condition is linear in x)."""
    rng = np.random.default_rng(5)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value or 2 for d in value.type.tensor_type.shape.dim]
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, 50, dims, dtype=np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = (rng.random(dims) < 0.8).astype(np.int64)
        else:
            feeds[value.name] = (sign * np.abs(rng.standard_normal(dims))).astype(np.float32)
    return feeds


@pytest.mark.parametrize("kind", MODELS)
def test_sharded_model_computes_what_the_original_does(
    kind: str, model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """onnxruntime gives identical outputs for the original and the sharded file (both If branches).

    Basic graph optimisation: onnxruntime's extended fusions (MatMul+Add+Relu → FusedGemm) copy the
    Relu's attributes, ``__ipu_number`` included, and then reject the fused node.
    """
    path = model_path(kind)
    result = shard(path, 3)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    original = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    sharded = ort.InferenceSession(
        str(result.out / f"{kind}.sharded.onnx"), options, providers=["CPUExecutionProvider"]
    )
    for sign in (1.0, -1.0):
        feeds = _feeds(result.model, sign)
        expected = original.run(None, feeds)
        got = sharded.run(None, feeds)
        assert len(got) == len(expected) == len(result.model.graph.output)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)


def test_external_data_in_a_subfolder_keeps_its_relative_place(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """Weights at weights/w.data are copied to OUT/weights/w.data and the reference is unchanged."""
    path = model_path("shared_weights", external_data=True, hidden=32)
    model = onnx.load(str(path), load_external_data=False)
    (path.parent / "weights").mkdir()
    path.with_name("shared_weights.data").rename(path.parent / "weights" / "w.data")
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = "weights/w.data"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "out"
    assert cli_main(["shard", str(path), "-n", "2", "-b", "none", "-o", str(out), "-q"]) == 0
    assert sorted(_listing(out)) == sorted(
        [
            "weights/w.data",
            "shared_weights.sharded.onnx",
            "shared_weights.sharding.yaml",
            "report.html",
            "report.json",
            "report.md",
        ]
    )
    assert (out / "weights" / "w.data").read_bytes() == (
        path.parent / "weights" / "w.data"
    ).read_bytes()
    sharded = onnx.load(str(out / "shared_weights.sharded.onnx"))
    original = onnx.load(str(path))
    for a, b in zip(original.graph.initializer, sharded.graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_out_dir_equal_to_the_model_folder_reuses_the_data(model_path: Callable[..., Path]) -> None:
    """--out the model's own folder: the data file is left as it is and the sharded model reads it."""
    path = model_path("chain", external_data=True)
    data = path.with_name("chain.data")
    before = data.read_bytes()
    assert (
        cli_main(["shard", str(path), "-n", "2", "-b", "none", "-o", str(path.parent), "-q"]) == 0
    )
    assert data.read_bytes() == before
    assert sorted(_listing(path.parent)) == sorted(
        [
            "chain.onnx",
            "chain.data",
            "chain.sharded.onnx",
            "chain.sharding.yaml",
            "report.html",
            "report.json",
            "report.md",
        ]
    )
    sharded = onnx.load(str(path.with_name("chain.sharded.onnx")))
    assert all(numpy_helper.to_array(t).any() for t in sharded.graph.initializer)
