"""``sharderd plan`` when no split fits, run as a user runs it: ``--json`` prints a report whose
status says so (never "planned" before exit 5), and the hint names a device count on which the
planner does find a split, so that following it ends the search (it named one more device at a
time before: a U-Net needed three reruns).

The model: 6 parallel chains of 7 MatMuls (64x64 fp32 weights, 16 KiB each) summed; the target
holds 43,750 B, so with the 1.15 margin two weights fit a device and three do not. The weights
alone prove 15 devices too few (exit 3, 42 x 16 KiB > 15 x 43,750 B); 16 to 20 find no split (exit
5; on 20 the order search's least overfull split), and 21 fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

CONFIG = """
[target]
name = "small"

[targets.small]
base = "cpu"
memory_bytes = 43750
code_bytes_per_node = 0
"""


@pytest.fixture(scope="module")
def fan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("fan")
    nodes, weights, ends = [], [], []
    for b in range(6):
        prev = "x"
        for i in range(7):
            weights.append(
                numpy_helper.from_array(np.full((64, 64), 0.01, np.float32), f"w{b}_{i}")
            )
            nodes.append(
                helper.make_node("MatMul", [prev, f"w{b}_{i}"], [f"h{b}_{i}"], name=f"mm{b}_{i}")
            )
            prev = f"h{b}_{i}"
        ends.append(prev)
    nodes.append(helper.make_node("Sum", ends, ["y"], name="sum"))
    graph = helper.make_graph(
        nodes,
        "fan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        weights,
    )
    model = folder / "fan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    config = folder / "sharderd.toml"
    config.write_text(CONFIG)
    return model, config


def _plan(fan: tuple[Path, Path], devices: int) -> tuple[int, dict | None, str]:
    model, config = fan
    run = subprocess.run(
        [
            *(sys.executable, "-m", "sharderd.cli", "plan", str(model), "--devices", str(devices)),
            *("--config", str(config), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return run.returncode, json.loads(run.stdout) if run.stdout else None, run.stderr


@pytest.mark.parametrize("devices", [16, 20])
def test_no_split_found_says_not_proven_and_names_the_count_that_fits(
    fan: tuple[Path, Path], devices: int
) -> None:
    code, report, stderr = _plan(fan, devices)
    assert code == 5, stderr
    assert report is not None and report["status"] == "not_proven"
    assert report["error"]["exit_code"] == 5 and report["error"]["reason"] == "not_proven"
    assert "rerun with --devices 21 " in report["error"]["hint"]
    assert "rerun with --devices 21 " in stderr
    if devices == 20:  # the order search's least overfull split is in the report
        assert report["plan"]["method"] == "overfull" and report["plan"]["devices"] == 20
    else:  # the search ruled every split out: no plan
        assert report["plan"] is None


def test_the_count_the_hint_names_plans(fan: tuple[Path, Path]) -> None:
    code, report, stderr = _plan(fan, 21)
    assert code == 0, stderr
    assert report is not None and report["status"] == "planned" and report["error"] is None


def test_proven_too_few_prints_a_does_not_fit_report(fan: tuple[Path, Path]) -> None:
    code, report, stderr = _plan(fan, 15)
    assert code == 3, stderr
    assert report is not None and report["status"] == "does_not_fit" and report["plan"] is None
    assert report["verdict"]["proven"] and report["verdict"]["grounds"] == "weights_total"
