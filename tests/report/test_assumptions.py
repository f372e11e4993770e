"""sharderd.report.assumptions: which dims were filled from the default batch_size, said per dim."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

from sharderd.config import Config, PlanConfig, amend_plan, config_from_dict
from sharderd.report.assumptions import defaulted_dims


def _inputs(**shapes: list[Any]) -> list[dict[str, Any]]:
    return [{"name": name, "dtype": "float", "shape": shape} for name, shape in shapes.items()]


def _config(**plan: Any) -> Config:
    """A config whose file's [plan] sets ``plan`` (so they count as given)."""
    return config_from_dict({"plan": plan}, "test")


def test_a_symbolic_leading_dim_nobody_set_is_named_with_every_place_it_is_used() -> None:
    inputs = _inputs(ids=["batch", 128], mask=["batch", "seq"], other=[4, "batch"])
    (warning,) = defaulted_dims(inputs, _config(dims={"seq": 128}))
    assert warning.startswith(
        "dim 'batch' (input 'ids' axis 0, input 'mask' axis 0, input 'other' axis 1) was given no "
        "value and is planned as 1, the default batch_size: say so with `--batch-size 1`"
    )


def test_anonymous_leading_dims_are_one_warning_each() -> None:
    inputs = _inputs(a=["?", 3], b=[-1, 3], c=[2, 3])
    warnings = defaulted_dims(inputs, Config())
    assert [w.split(" was ")[0] for w in warnings] == [
        "an anonymous dim (input 'a' axis 0)",
        "an anonymous dim (input 'b' axis 0)",
    ]


@pytest.mark.parametrize(
    "config",
    [
        _config(batch_size=1),  # given in the file, even at the default's value
        amend_plan(Config(), batch_size=1),  # given by a flag or an argument
        _config(dims={"batch": 2}),
        _config(input_shapes={"ids": [2, 128], "mask": [2, 128]}),
    ],
)
def test_nothing_is_said_when_the_dim_was_given(config: Config) -> None:
    assert defaulted_dims(_inputs(ids=["batch", 128], mask=["batch", 128]), config) == []


def test_a_dim_named_by_another_inputs_shape_is_given() -> None:
    """input_shapes of 'ids' fixes 'batch' for 'mask' too (as the planner resolves it)."""
    config = _config(input_shapes={"ids": [2, 128]})
    assert defaulted_dims(_inputs(ids=["batch", 128], mask=["batch", 128]), config) == []


def test_static_inputs_and_non_leading_dims_are_never_defaulted() -> None:
    assert defaulted_dims(_inputs(a=[1, 3], b=[2, "seq"], s=[]), Config()) == []


def test_the_default_value_is_what_is_said() -> None:
    """Not given, but the file's default changed? Impossible: any [plan] batch_size is given.
    A config built in code with another default value says that value."""
    config = Config(plan=PlanConfig(batch_size=3))
    (warning,) = defaulted_dims(_inputs(x=["n", 2]), config)
    assert "planned as 3" in warning and "`--batch-size 3`" in warning


def test_the_cli_says_it_on_stderr_and_in_report_json(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    model = tmp_path / "m.onnx"
    model.write_bytes(helper.make_model(graph).SerializeToString())
    done = run_cli("plan", model, "-n", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("sharderd: warning: ")]
    report = json.loads(done.stdout)
    assert line.removeprefix("sharderd: warning: ") in report["warnings"]
    assert "dim 'n' (input 'x' axis 0)" in line
    given = run_cli("plan", model, "-n", "1", "--json", "--batch-size", "1", cwd=tmp_path)
    assert "warning:" not in given.stderr and json.loads(given.stdout)["warnings"] == []
    shard = run_cli(
        "shard", model, "-n", "1", "-b", "none", "-q", "-o", tmp_path / "o", cwd=tmp_path
    )
    assert shard.returncode == 0 and line in shard.stderr.splitlines()
    assert (
        line.removeprefix("sharderd: warning: ")
        in json.loads((tmp_path / "o" / "report.json").read_text())["warnings"]
    )
