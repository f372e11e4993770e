"""The Python API's surface (``sharderd.__all__``, signatures, docs/python.md) and that it does what
the commands do."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import onnx
import pytest

import sharderd
from sharderd import errors
from sharderd.cli import main as cli_main

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
    "StorageError",
    "WorkerCrashedError",
    "WorkerDiedError",
}
"""Errors only the daemon raises (its inbox, workers, cancel requests, bookkeeping)."""
PLAN_PARAMS = [
    ("model", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
    ("devices", "KEYWORD_ONLY", inspect.Parameter.empty),
    ("target", "KEYWORD_ONLY", None),
    ("input_shapes", "KEYWORD_ONLY", None),
    ("dims", "KEYWORD_ONLY", None),
    ("batch_size", "KEYWORD_ONLY", None),
    ("precision", "KEYWORD_ONLY", None),
    ("serialize", "KEYWORD_ONLY", True),
    ("config", "KEYWORD_ONLY", None),
]
SHARD_PARAMS = [
    *PLAN_PARAMS[:2],
    ("out", "KEYWORD_ONLY", inspect.Parameter.empty),
    ("backend", "KEYWORD_ONLY", None),
    *PLAN_PARAMS[2:7],
    ("serialize", "KEYWORD_ONLY", True),
    ("optimal_perf", "KEYWORD_ONLY", None),
    ("max_attempts", "KEYWORD_ONLY", None),
    ("parallel", "KEYWORD_ONLY", None),
    ("attempt_timeout", "KEYWORD_ONLY", None),
    ("stem", "KEYWORD_ONLY", None),
    PLAN_PARAMS[8],
    ("on_event", "KEYWORD_ONLY", None),
]


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
        assert result.status == "compiled" and result.backend == "onnxruntime"
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
