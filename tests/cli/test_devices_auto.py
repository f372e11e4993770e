"""``--devices auto --max-devices N`` and the line that says when fewer devices would do, run as
a user runs them (the real CLI in a subprocess) on a real export whose last stage is held by the
logits' host transfer (tiny_gpt2 at sequence 128: 8 devices plan at the pace 7 give)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_gpt2" / "model.onnx"
SHAPES = ("--dim", "sequence=128", "--dim", "batch=1")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sharderd.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_plan_says_when_fewer_devices_keep_the_throughput_and_the_hint_works() -> None:
    run = _cli("plan", str(MODEL), "--devices", "8", *SHAPES, "--json")
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)["plan"]
    assert plan["devices"] == 8 and plan["fewest_devices"] == 7
    assert plan["fewest_devices_bottleneck_s"] <= plan["bottleneck_s"] * 1.01
    assert plan["bottleneck_held_by"]["kind"] == "host_output"
    assert plan["bottleneck_held_by"]["tensors"] == ["logits"]
    line = [x for x in run.stderr.splitlines() if "device(s) give the predicted throughput" in x]
    assert line == [
        "sharderd: 7 device(s) give the predicted throughput of these 8 (within 1%); plan on "
        "them with --devices 7, or let sharderd choose with --devices auto --max-devices 8"
    ]
    hinted = _cli("plan", str(MODEL), "--devices", "auto", "--max-devices", "8", *SHAPES, "--json")
    assert hinted.returncode == 0, hinted.stderr
    auto = json.loads(hinted.stdout)["plan"]
    assert (auto["devices"], auto["max_devices"]) == (7, 8)
    assert auto["bottleneck_s"] == pytest.approx(plan["fewest_devices_bottleneck_s"], rel=1e-9)
    assert "--devices auto chose 7 of at most 8 devices" in hinted.stderr
    # At the fewest already: nothing to say.
    seven = _cli("plan", str(MODEL), "--devices", "7", *SHAPES, "--json")
    assert json.loads(seven.stdout)["plan"]["fewest_devices"] == 7
    assert "give the predicted throughput" not in seven.stderr


def test_shard_auto_writes_the_chosen_count(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _cli(
        "shard", str(MODEL), "--devices", "auto", "--max-devices", "8", *SHAPES,
        "--backend", "none", "--out", str(out), "--quiet",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    plan = json.loads((out / "report.json").read_text())["plan"]
    assert (plan["devices"], plan["max_devices"], plan["fewest_devices"]) == (7, 8, 7)
    assert (
        "`--devices auto`: 7 device(s), the fewest of at most 8" in (out / "report.md").read_text()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--devices", "auto"), "--devices auto needs --max-devices N"),
        (("--devices", "4", "--max-devices", "8"), "--max-devices applies to --devices auto only"),
        (("--devices", "auto", "--max-devices", "0"), "--max-devices must be >= 1"),
        (("--devices", "lots"), "expected a device count or auto, got 'lots'"),
    ],
)
def test_bad_device_requests_exit_2(args: tuple[str, ...], message: str) -> None:
    run = _cli("plan", str(MODEL), *args, *SHAPES)
    assert run.returncode == 2 and message in run.stderr
