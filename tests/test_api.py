"""The Python API's surface (``sharderd.__all__``, signatures, docs/python.md) and that it does what
the commands do."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import onnx
import pytest
from onnx import TensorProto, helper

import sharderd
from sharderd import errors
from sharderd.cli import main as cli_main
from sharderd.cli.parser import build_parser

REPO = Path(__file__).resolve().parent.parent

PUBLIC = {
    "plan",
    "shard",
    "shard_async",
    "Attempt",
    "Plan",
    "ShardResult",
    "Stage",
    "Verification",
    "Config",
    "Target",
    "load_config",
    "targets",
    "BackendUnavailableError",
    "CompileFailedError",
    "ConfigError",
    "DimsUnresolvedError",
    "ModelInvalidError",
    "NoSplitError",
    "NotProvenError",
    "OutputWriteError",
    "PlanInfeasibleError",
    "SharderdError",
    "VerificationError",
    "__version__",
}
DAEMON_ONLY_ERRORS = {
    "BadJobError",
    "InternalError",
    "JobCancelledError",
    "PlanningLimitError",
    "StorageError",
    "WorkerCrashedError",
    "WorkerDiedError",
}
"""Errors only the daemon raises (its inbox, workers, cancel requests, bookkeeping)."""
PLAN_PARAMS = [
    ("model", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
    ("devices", "KEYWORD_ONLY", inspect.Parameter.empty),
    ("max_devices", "KEYWORD_ONLY", None),
    ("target", "KEYWORD_ONLY", None),
    ("input_shapes", "KEYWORD_ONLY", None),
    ("dims", "KEYWORD_ONLY", None),
    ("batch_size", "KEYWORD_ONLY", None),
    ("precision", "KEYWORD_ONLY", None),
    ("safety_margin", "KEYWORD_ONLY", None),
    ("name_nodes", "KEYWORD_ONLY", False),
    ("serialize", "KEYWORD_ONLY", True),
    ("config", "KEYWORD_ONLY", None),
]
SHARD_PARAMS = [
    *PLAN_PARAMS[:3],
    ("out", "KEYWORD_ONLY", inspect.Parameter.empty),
    ("backend", "KEYWORD_ONLY", None),
    *PLAN_PARAMS[3:10],
    ("keep_dynamic", "KEYWORD_ONLY", False),
    ("serialize", "KEYWORD_ONLY", True),
    ("optimal_perf", "KEYWORD_ONLY", None),
    ("max_attempts", "KEYWORD_ONLY", None),
    ("parallel", "KEYWORD_ONLY", None),
    ("attempt_timeout", "KEYWORD_ONLY", None),
    ("overwrite", "KEYWORD_ONLY", False),
    ("stem", "KEYWORD_ONLY", None),
    PLAN_PARAMS[11],
    ("on_event", "KEYWORD_ONLY", None),
]
FLAG_KEYWORDS = {
    "model": "model",
    "devices": "devices",
    "max_devices": "max_devices",
    "target": "target",
    "config": "config",
    "batch_size": "batch_size",
    "safety_margin": "safety_margin",
    "name_nodes": "name_nodes",
    "input_shape": "input_shapes",
    "dim": "dims",
    "precision": "precision",
    "keep_dynamic": "keep_dynamic",
    "no_serialize": "serialize",
    "out": "out",
    "overwrite": "overwrite",
    "backend": "backend",
    "optimal_perf": "optimal_perf",
    "max_attempts": "max_attempts",
    "parallel": "parallel",
    "attempt_timeout": "attempt_timeout",
}
"""Each planning option of ``sharderd plan``/``shard`` (argparse ``dest``) → its API keyword."""
NOT_PLANNING = {"help", "json", "quiet", "command_parser"}
"""What the commands print, not what they plan: no keyword."""
WRITES_NOTHING = {("plan", "keep_dynamic")}
"""``sharderd plan --keep-dynamic`` is accepted (the flags are shared) but plan writes no model."""


def _timeless(section: dict[str, Any]) -> dict[str, Any]:
    """A plan section without the planner's own timings (they differ from run to run)."""
    return {**section, "planner": {**section["planner"], "timings_s": None}}


def _params(func: Callable[..., Any]) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(func).parameters.values()]


def test_all_names_exactly_the_public_api() -> None:
    """Adding or dropping a public name is a decision: this list changes with it."""
    assert set(sharderd.__all__) == PUBLIC
    assert len(sharderd.__all__) == len(PUBLIC)
    for name in sharderd.__all__:
        assert hasattr(sharderd, name), name


def test_every_error_a_caller_can_meet_is_exported_with_its_exit_code() -> None:
    """A new error type in sharderd.errors must be exported (or named daemon-only here)."""
    raised = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type)
        and issubclass(getattr(errors, name), errors.SharderdError)
    }
    assert raised - DAEMON_ONLY_ERRORS <= set(sharderd.__all__)
    for name in raised - DAEMON_ONLY_ERRORS:
        cls = getattr(sharderd, name)
        assert cls is getattr(errors, name) and isinstance(cls.exit_code, int)


def test_signatures() -> None:
    assert _params(sharderd.plan) == PLAN_PARAMS
    assert _params(sharderd.shard) == SHARD_PARAMS
    assert _params(sharderd.shard_async) == SHARD_PARAMS
    assert inspect.iscoroutinefunction(sharderd.shard_async)
    assert _params(sharderd.load_config) == [
        ("path", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty)
    ]
    assert _params(sharderd.targets) == [("config", "POSITIONAL_OR_KEYWORD", None)]
    for func in (sharderd.plan, sharderd.shard, sharderd.shard_async, sharderd.load_config):
        assert inspect.signature(func).return_annotation != inspect.Signature.empty


@pytest.mark.parametrize("command", ["plan", "shard"])
def test_every_planning_flag_is_a_keyword(command: str) -> None:
    """A flag added to the command without its keyword (or the reverse) fails here."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    dests = {a.dest for a in sub.choices[command]._actions} - NOT_PLANNING
    unmapped = dests - set(FLAG_KEYWORDS)
    assert not unmapped, f"flags of `sharderd {command}` with no API keyword: {unmapped}"
    expected = {FLAG_KEYWORDS[d] for d in dests if (command, d) not in WRITES_NOTHING}
    function = getattr(sharderd, command)
    keywords = set(inspect.signature(function).parameters)
    assert expected <= keywords, expected - keywords
    extra = keywords - expected - {"stem", "on_event"}  # the API's own: file name, progress
    assert not extra, f"keywords of sharderd.{command} with no flag: {extra}"


def test_results_are_frozen_values() -> None:
    for cls in (sharderd.Plan, sharderd.Stage, sharderd.ShardResult, sharderd.Attempt):
        assert dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        assert hasattr(cls, "__slots__"), cls


def test_import_is_light_and_the_names_stay_functions() -> None:
    """``import sharderd`` loads neither onnx nor numpy; importing the ``plan`` and ``shard``
    subpackages (as every call does) leaves ``sharderd.plan`` and ``sharderd.shard`` the functions."""
    code = (
        "import sys, sharderd\n"
        "assert 'onnx' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'\n"
        "import sharderd.plan.planner, sharderd.shard.write\n"
        "from sharderd.plan.types import Plan\n"
        "assert callable(sharderd.plan) and sharderd.plan.__module__ == 'sharderd.api'\n"
        "assert callable(sharderd.shard) and sharderd.shard.__module__ == 'sharderd.api'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_issue_command_after_example_model(tmp_path: Path) -> None:
    """README's first command writes the model; the one-liner from the issue plans it."""
    assert cli_main(["example-model", "--out", str(tmp_path / "example-transformer.onnx")]) == 0
    line = (
        "import sharderd; p = sharderd.plan('example-transformer.onnx', devices=4); "
        "print(p.bottleneck_s, len(p.stages))"
    )
    done = subprocess.run(
        [sys.executable, "-c", line],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    bottleneck, stages = done.stdout.split()
    assert float(bottleneck) > 0 and stages == "4"


def test_plan_is_the_cli_plan(model_path: Callable[..., Path], capsys: Any) -> None:
    path = model_path("transformer")
    plan = sharderd.plan(path, devices=3, batch_size=2)
    assert cli_main(["plan", str(path), "-n", "3", "--batch-size", "2", "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["plan"]
    assert _timeless(plan.to_dict()) == _timeless(section)
    assert plan.digest == section["digest"] and plan.bottleneck_s == section["bottleneck_s"]
    assert [s.time_s for s in plan.stages] == [s["time_s"] for s in section["stages"]]
    assert max(s.time_s for s in plan.stages) == plan.bottleneck_s >= plan.lower_bound_s
    nodes = onnx.load(str(path)).graph.node
    assert sorted(n for s in plan.stages for n in s.nodes) == sorted(n.name for n in nodes)
    op_of = {n.name: n.op_type for n in nodes}
    for stage, raw in zip(plan.stages, section["stages"], strict=True):
        assert len(stage.nodes) == raw["num_nodes"] == len(stage.ops)
        assert {raw["first_node"], raw["last_node"]} <= set(stage.nodes)
        assert list(stage.ops) == [op_of[n] for n in stage.nodes]
        assert stage.memory_bytes == stage.weight_bytes + stage.activation_bytes + stage.code_bytes
        assert stage.to_dict() == raw


def test_plan_of_a_model_in_memory_and_with_a_target_value(model_path: Callable[..., Path]) -> None:
    path = model_path("transformer")
    by_path = sharderd.plan(path, devices=2, target="cpu")
    in_memory = sharderd.plan(onnx.load(str(path)), devices=2, target=sharderd.targets()["cpu"])
    assert in_memory.digest == by_path.digest and in_memory.bottleneck_s == by_path.bottleneck_s
    other = sharderd.plan(path, devices=2, target="ipu-mk2")
    assert other.bottleneck_s != by_path.bottleneck_s  # the target reached the planner


def test_plan_errors_are_the_typed_errors(model_path: Callable[..., Path]) -> None:
    path = model_path("transformer")
    with pytest.raises(sharderd.ConfigError) as bad:
        sharderd.plan(path, devices=2, target="no-such-target")
    assert bad.value.exit_code == 2
    tiny = dataclasses.replace(sharderd.targets()["cpu"], name="tiny", memory_bytes=1024)
    with pytest.raises(sharderd.PlanInfeasibleError) as infeasible:
        sharderd.plan(path, devices=2, target=tiny)
    assert infeasible.value.exit_code == 3
    with pytest.raises(sharderd.ConfigError, match=r"model must be a path or an onnx\.ModelProto"):
        sharderd.plan(b"not a model", devices=2)  # type: ignore[arg-type]


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith("report.")
    }


@pytest.mark.parametrize("backend", ["none", "onnxruntime"])
def test_shard_writes_what_the_cli_writes(
    model_path: Callable[..., Path], tmp_path: Path, backend: str
) -> None:
    path = model_path("transformer", external_data=True)
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    argv = ["shard", str(path), "-n", "2", "--out", str(cli_out), "--backend", backend, "-q"]
    assert cli_main(argv) == 0
    result = sharderd.shard(path, devices=2, out=api_out, backend=backend)
    assert _tree(api_out) == _tree(cli_out) and _tree(cli_out)
    cli_report = json.loads((cli_out / "report.json").read_text())
    assert _timeless(result.plan.to_dict()) == _timeless(cli_report["plan"])
    assert result.plan.to_dict() == result.to_dict()["plan"]
    assert result.to_dict()["outputs"] == cli_report["outputs"]
    assert set(result.files) == set(api_out.iterdir())
    assert result.external_data and all(p.is_file() for p in result.external_data)
    planned = sharderd.plan(path, devices=2)  # the written model's nodes, routing nodes not counted
    assert [s.nodes for s in result.plan.stages] == [s.nodes for s in planned.stages]
    assert result.to_dict()["plan"]["routed_inputs"], "the case must route an input"
    if backend == "none":
        assert result.status == "not_compiled" and result.attempts == ()
        assert result.verification is None and result.chosen_attempt is None
    else:
        assert result.status == "verified" and result.backend == "onnxruntime"
        chosen = result.attempts[result.chosen_attempt or 0]
        assert chosen.ok and chosen.plan_digest == result.plan.digest
        cli_chosen = cli_report["attempts"][cli_report["chosen_attempt"]]
        assert chosen.to_dict().keys() == cli_chosen.keys()
        assert (chosen.label, chosen.outcome) == (cli_chosen["label"], cli_chosen["outcome"])
        assert chosen.throughput_per_s == chosen.to_dict()["benchmark"]["throughput_per_s"] > 0
        assert result.verification is not None and result.verification.passed
        assert result.verification.to_dict() == result.to_dict()["verification"]


def test_shard_failure_raises_the_jobs_error_type(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    tiny = dataclasses.replace(sharderd.targets()["cpu"], name="tiny", memory_bytes=1024)
    with pytest.raises(sharderd.PlanInfeasibleError):
        sharderd.shard(
            model_path("transformer"), devices=2, out=tmp_path / "o", backend="none", target=tiny
        )
    with pytest.raises(sharderd.ConfigError, match="parallel must be >= 1"):
        sharderd.shard(model_path("transformer"), devices=2, out=tmp_path / "o", parallel=0)


def test_shard_async_in_the_callers_loop_reports_events(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    seen: list[str] = []

    async def main() -> sharderd.ShardResult:
        return await sharderd.shard_async(
            onnx.load(str(model_path("transformer"))),
            devices=2,
            out=tmp_path / "o",
            backend="none",
            stem="mine",
            on_event=lambda event, fields: seen.append(event),
        )

    result = anyio.run(main)
    assert result.model == tmp_path / "o" / "mine.sharded.onnx" and result.model.is_file()
    assert seen[:2] == ["backend.selected", "plan.started"] and "plan.finished" in seen


def test_load_config_and_targets(tmp_path: Path) -> None:
    toml = tmp_path / "sharderd.toml"
    toml.write_text(
        "[plan]\nbatch_size = 4\n[targets.mine]\nkind = 'cpu'\nmemory_bytes = 1000000\n"
        "flops_per_s = 1e9\nlink_bytes_per_s = 1e9\nhost_bytes_per_s = 1e9\n"
    )
    config = sharderd.load_config(str(toml))
    assert isinstance(config, sharderd.Config) and config.plan.batch_size == 4
    assert "mine" in sharderd.targets(config) and "mine" not in sharderd.targets()
    assert {"ipu-mk2", "cpu"} <= set(sharderd.targets())
    toml.write_text("[plan]\nbatch_sise = 4\n")
    with pytest.raises(sharderd.ConfigError, match="batch_sise"):
        sharderd.load_config(toml)


def test_docs_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``python`` block of docs/python.md, in order, in one folder after `sharderd example-model`."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "python.md").read_text(), re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    assert cli_main(["example-model"]) == 0
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/python.md block {i}", "exec"), {"__name__": "__docs__"})


# --- Python as a first-class door (issue 38) -----------------------------------------------------


def _helper_model() -> onnx.ModelProto:
    """As ``onnx.helper`` builds it: unnamed nodes, a symbolic batch and sequence."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_unnamed_nodes_are_named_by_a_keyword() -> None:
    model = _helper_model()
    with pytest.raises(sharderd.ModelInvalidError) as unnamed:
        sharderd.plan(model, devices=2, dims={"seq": 8}, batch_size=1)
    assert unnamed.value.hint == (
        "call again as sharderd.plan(model, devices=2, dims={'seq': 8}, batch_size=1, name_nodes=True)"
    )
    plan = sharderd.plan(model, devices=2, dims={"seq": 8}, batch_size=1, name_nodes=True)
    assert sorted(n for s in plan.stages for n in s.nodes) == ["Relu_0", "Sigmoid_0"]


def test_an_open_dim_is_said_as_a_keyword_with_its_placeholder() -> None:
    with pytest.raises(sharderd.DimsUnresolvedError) as open_dim:
        sharderd.plan(_helper_model(), devices=2, name_nodes=True)
    assert open_dim.value.hint == (
        "call again as sharderd.plan(model, devices=2, dims={'seq': SIZE}, name_nodes=True) "
        "(SIZE: the size to compile for)"
    )


def test_too_few_devices_is_not_proven_and_says_the_call_that_fits(
    model_path: Callable[..., Path],
) -> None:
    path = model_path("transformer")
    cpu = sharderd.targets()["cpu"]
    weights = sum(s.weight_bytes for s in sharderd.plan(path, devices=2, batch_size=1).stages)
    # the weights fit the two devices together (no proof), the estimate with its margin does not
    small = dataclasses.replace(cpu, name="small", memory_bytes=int(weights * 0.52))
    with pytest.raises(sharderd.NotProvenError) as short:
        sharderd.plan(path, devices=2, target=small, batch_size=1)
    err = short.value
    assert err.exit_code == 5 and err.min_devices is not None and err.min_devices > 2
    assert err.hint == (
        f"call again as sharderd.plan({str(path)!r}, devices={err.min_devices}, target=target, "
        "batch_size=1)"
    )
    assert "--" not in str(err)  # neither the message nor the hint names a flag
    plan = sharderd.plan(path, devices=err.min_devices, target=small, batch_size=1)
    assert len(plan.stages) == err.min_devices  # the call the hint names works


def test_a_defaulted_batch_dim_is_a_warning_and_a_given_one_is_not(
    model_path: Callable[..., Path],
) -> None:
    path = model_path("transformer")  # input_ids and attention_mask: ['batch', 8]
    with pytest.warns(
        UserWarning,
        match=r"dim 'batch' \(input 'input_ids' axis 0, input 'attention_mask' axis 0\)",
    ):
        sharderd.plan(path, devices=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharderd.plan(path, devices=2, batch_size=1)
        sharderd.plan(path, devices=2, dims={"batch": 1})


def test_shard_refuses_an_earlier_result_unless_overwrite(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    path, out = model_path("chain"), tmp_path / "out"
    sharderd.shard(path, devices=2, out=out, backend="none", batch_size=1)
    with pytest.raises(sharderd.ConfigError, match="already holds a result") as held:
        sharderd.shard(path, devices=2, out=out, backend="none", batch_size=1)
    assert held.value.hint == (
        f"call again as sharderd.shard({str(path)!r}, devices=2, out={str(out)!r}, "
        "backend='none', batch_size=1, overwrite=True)"
    )
    again = sharderd.shard(path, devices=2, out=out, backend="none", batch_size=1, overwrite=True)
    assert again.status == "not_compiled"


def test_a_missing_model_is_said_before_any_event(tmp_path: Path) -> None:
    seen: list[str] = []
    with pytest.raises(sharderd.ModelInvalidError, match="cannot read model"):
        sharderd.shard(
            tmp_path / "missing.onnx",
            devices=2,
            out=tmp_path / "o",
            on_event=lambda event, fields: seen.append(event),
        )
    assert seen == [] and not (tmp_path / "o").exists()


def test_devices_auto_plans_on_the_fewest_as_the_cli_does() -> None:
    """``devices="auto", max_devices=8`` is ``--devices auto --max-devices 8``: tiny_gpt2 at
    sequence 128 runs at the pace of 8 devices on 7 (tests/cli/test_devices_auto.py); a
    ``max_devices`` without ``auto``, or ``auto`` without it, is a ConfigError whose hint is a call."""
    model = REPO / "tests" / "data" / "models" / "tiny_gpt2" / "model.onnx"
    shapes = {"dims": {"sequence": 128, "batch": 1}}
    auto = sharderd.plan(model, devices="auto", max_devices=8, **shapes)
    assert len(auto.stages) == 7 and auto.to_dict()["max_devices"] == 8
    with pytest.raises(sharderd.ConfigError) as given_both:
        sharderd.plan(model, devices=4, max_devices=8, **shapes)
    assert "devices='auto', max_devices=8" in str(given_both.value.hint)
    with pytest.raises(sharderd.ConfigError) as no_most:
        sharderd.plan(model, devices="auto", **shapes)
    assert "max_devices=8" in str(no_most.value.hint)
