"""Issue 30 item 3, second half: a wide head whose own time holds every split up is serialized
into column pieces through the real CLI (``plan`` and ``shard --backend onnxruntime``) and the API;
the stages are verified against the user's file and the bottleneck is lower than with
``--no-serialize``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import sharderd
from sharderd import examples
from sharderd.cli import main as cli_main
from sharderd.plan.serialize_choice import BOTTLENECK_GAIN

COMMON = ["--devices", "4", "--target", "cpu"]


def _shard(model: Path, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["shard", str(model), *COMMON, "--backend", "onnxruntime", "-q", "-o", str(out)]
    assert cli_main([*argv, *extra]) == 0
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert report["verification"]["passed"] is True
    assert report["verification"]["reference_model"] == str(model.resolve())
    return report


def test_shard_serializes_the_head_that_holds_the_bottleneck_up(tmp_path: Path) -> None:
    model = examples.save(examples.wide_head(), tmp_path / "wide.onnx")
    report = _shard(model, tmp_path / "out")
    whole = _shard(model, tmp_path / "whole", "--no-serialize")
    assert "serialized" not in whole
    [s] = report["serialized"]
    assert (s["node"], s["kind"], s["reason"]) == ("MatMul_head", "columns", "bottleneck")
    assert s["bottleneck_after_s"] < s["bottleneck_before_s"] * (1 - BOTTLENECK_GAIN)
    assert len(set(s["stages"])) > 1  # the pieces run on different stages
    assert report["plan"]["bottleneck_s"] < whole["plan"]["bottleneck_s"] * (1 - BOTTLENECK_GAIN)
    assert whole["plan"]["bottleneck_s"] == pytest.approx(s["bottleneck_before_s"])
    assert report["model"]["name"] == "wide.onnx"
    assert report["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    md = (tmp_path / "out" / "report.md").read_text()
    assert "serialized `MatMul_head` (MatMul, its own time held the bottleneck up" in md


def test_plan_and_api_serialize_it_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = examples.save(examples.wide_head(), tmp_path / "wide.onnx")
    assert cli_main(["plan", str(model), *COMMON, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [s] = report["serialized"]
    assert s["reason"] == "bottleneck" and s["bottleneck_after_s"] == report["plan"]["bottleneck_s"]
    assert report["model"]["path"] == str(model)
    planned = sharderd.plan(model, devices=4, target="cpu")
    names = {name for stage in planned.stages for name in stage.nodes}
    assert set(s["piece_nodes"]) <= names and "MatMul_head" not in names
    assert planned.bottleneck_s == pytest.approx(report["plan"]["bottleneck_s"])
    kept = sharderd.plan(model, devices=4, target="cpu", serialize=False)
    assert "MatMul_head" in {name for stage in kept.stages for name in stage.nodes}
    assert kept.bottleneck_s == pytest.approx(s["bottleneck_before_s"])
