"""Compile attempts that prove a plan, driven through the real CLI against the fake ``poprt``
(tests/fake_poprt), whose memory truth is deliberately not sharderd's own model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from sharderd import examples

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake_poprt"
TILES = 24
CONFIG = f"""
[target]
name = "mini"

[targets.mini]
base = "ipu-mk2"
tiles = {TILES}
memory_bytes = {TILES * 638976}

[search]
kill_grace = 0.5
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer transformer (~20 MB of weights): needs 4+ devices of the 24-tile target."""
    path = tmp_path_factory.mktemp("prove") / "mid.onnx"
    return examples.save(examples.transformer(layers=6, hidden=256, seq=128, vocab=1000), path)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "sharderd.toml"
    path.write_text(CONFIG)
    return path


def shard(
    model: Path,
    config: Path,
    out: Path,
    devices: int,
    *extra: str,
    truth: dict[str, Any] | None = None,
    mode: str = "normal",
    fake: bool = True,
    env_extra: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    log = out.parent / f"{out.name}.compiles.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_POPRT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE), str(REPO)] if fake else [str(REPO)]),
        FAKE_POPRT_TILES=str(TILES),
        FAKE_POPRT_LOG=str(log),
        FAKE_POPRT_MODE=mode,
        FAKE_POPRT_TRUTH=json.dumps(truth or {}),
    )
    env.update(env_extra or {})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharderd.cli",
            "shard",
            str(model),
            "--devices",
            str(devices),
            "--backend",
            "poprt",
            "--config",
            str(config),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a loaded machine; a hang still ends the test
        check=False,
    )
    compiles = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, compiles


def report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def test_first_plan_compiles_when_the_model_is_right(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """When sharderd's prediction holds, one compile proves the plan and its PopEF is published."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 5)
    assert proc.returncode == 0, proc.stderr
    data = report(out)
    assert data["status"] == "compiled" and data["backend"] == "poprt"
    assert len(compiles) == 1 and compiles[0]["result"] == "ok"
    options = compiles[0]["options"]
    assert options["num_ipus"] == 5 and options["virtual_graph_mode"] == "manual"
    assert options["enable_pipelining"] is True and options["batches_per_step"] >= 5
    assert (out / data["outputs"]["compiled"]).is_file()
    assert (out / "mid.sharded.onnx").is_file()


def test_converges_after_a_wrong_first_plan(model: Path, config: Path, tmp_path: Path) -> None:
    """An OOM on device 0 corrects the bytes of the nodes it held; the exact re-plan then compiles."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 5, truth={"code_bytes": {"Gather": 4_500_000}})
    assert proc.returncode == 0, proc.stderr
    data = report(out)
    attempts = data["attempts"]
    assert [a["outcome"] for a in attempts[:2]] == ["oom", "ok"]
    assert attempts[0]["oom"]["device"] == 0 and attempts[0]["oom"]["bytes_used"] > 638976
    correction = attempts[0]["correction"]
    assert (
        correction["device"] == 0 and correction["scale_after"][0] > correction["scale_before"][0]
    )
    assert attempts[1]["plan_digest"] != attempts[0]["plan_digest"]
    assert data["plan"]["digest"] == attempts[1]["plan_digest"]
    assert data["plan"]["memory_scale"][0] > 1.0
    assert len(compiles) == 2


def test_no_split_is_compiled_twice(model: Path, config: Path, tmp_path: Path) -> None:
    """Every attempt differs from every earlier one in its split or its options."""
    out = tmp_path / "out"
    proc, _ = shard(model, config, out, 4, truth={"code_bytes": {"Gather": 8_000_000}})
    attempts = report(out)["attempts"]
    keys = [
        (
            a["plan_digest"],
            a["options"]["available_memory_proportion"],
            tuple(a["options"].get("stage_available_memory_proportion", ())),
        )
        for a in attempts
        if a["outcome"] != "cancelled"
    ]
    assert len(keys) == len(set(keys)) >= 2
    assert proc.returncode in (0, 3, 5)


def test_a_model_that_cannot_fit_costs_no_compile(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """Too few devices by the estimate (weights and code × margin over the devices together), the
    weights alone not: no compile, exit 5 (not proven), and the device count the estimate suggests."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 2)
    assert proc.returncode == 5, proc.stderr
    assert compiles == []
    assert "no fitting split found on 2 × mini (not proven)" in proc.stderr
    assert "rerun with --devices" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_fixed_cost_that_still_fits_is_compiled_not_declared_hopeless(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """10 MB of Gather code on device 0: two nested overflows show a fixed cost; with the margin no
    split fits, as measured (the cost on the heaviest of its nodes) one device can still hold the
    Gather; that split is compiled and fits (no wrong verdict), in three compiles."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 5, truth={"code_bytes": {"Gather": 10_000_000}})
    assert proc.returncode == 0, proc.stderr
    labels = [a["label"] for a in report(out)["attempts"]]
    assert any(label.startswith("verdict check") for label in labels)
    assert compiles[-1]["result"] == "ok" and len(compiles) <= 3


def test_a_fixed_cost_over_a_device_is_not_proven_in_two_compiles(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """16 MB of Gather code exceeds a whole device, a cost no estimate nor probe saw: the search
    ends in at most two compiles with no AMP retry (the temporaries AMP bounds are far below the
    gap) and says "not proven" (exit 5), not "does not fit": per-op code is no ground of a proof."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 5, truth={"code_bytes": {"Gather": 16_000_000}})
    assert proc.returncode == 5, proc.stderr
    assert "no fitting split found on 5 × mini (not proven)" in proc.stderr
    assert "device 0" in proc.stderr and "does not fit" not in proc.stderr
    assert len(compiles) <= 2
    assert all(c["options"]["available_memory_proportion"] == 0.6 for c in compiles)
    assert "available_memory_proportion was not tried" in proc.stderr
    data = report(out)
    assert data["status"] == "not_proven" and data["error"]["reason"] == "not_proven"
    assert data["verdict"] == {"proven": False, "grounds": None}


def test_segfaulting_compiler_is_a_crashed_outcome(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """A compiler that dies by SIGSEGV is an outcome with the signal, and the job fails with exit 1."""
    out = tmp_path / "out"
    proc, _ = shard(model, config, out, 5, "--max-attempts", "2", mode="segfault")
    assert proc.returncode == 1
    assert "no plan compiled" in proc.stderr
    attempts = report(out)["attempts"]
    assert attempts and all(a["outcome"] == "crashed" and a["signal"] == 11 for a in attempts)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker.encode() in environ and ") Z " not in stat:
            found.append(int(entry.name))
    return found


def test_hung_compile_times_out_and_leaves_no_process(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """A compile that never returns is killed with its process group at the timeout; nothing survives."""
    out = tmp_path / "out"
    marker = f"SHARDERD_TEST_MARKER={uuid.uuid4().hex}"
    key, value = marker.split("=")
    proc, _ = shard(
        model,
        config,
        out,
        5,
        "--attempt-timeout",
        "1",
        "--max-attempts",
        "1",
        mode="hang",
        env_extra={key: value},
    )
    assert proc.returncode == 1
    attempts = report(out)["attempts"]
    assert [a["outcome"] for a in attempts] == ["timeout"]
    assert _processes_with(marker) == []


def test_unknown_compiler_error_is_invalid_with_its_text(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """A compiler error no parser knows stops the search with the compiler's own words."""
    out = tmp_path / "out"
    proc, compiles = shard(model, config, out, 5, mode="unknown_error")
    assert proc.returncode == 1
    assert "rejected the sharded model" in proc.stderr
    assert len(compiles) == 1
    assert report(out)["attempts"][0]["outcome"] == "invalid"


def test_poprt_missing_is_exit_4(model: Path, config: Path, tmp_path: Path) -> None:
    """Asking for poprt where the Poplar SDK is absent says what to do, with exit code 4."""
    proc, _ = shard(model, config, tmp_path / "out", 5, fake=False)
    assert proc.returncode == 4
    assert (
        "poprt is not installed: install the Poplar SDK or use --backend onnxruntime" in proc.stderr
    )


def test_optimal_perf_benchmarks_and_keeps_the_fastest(
    model: Path, config: Path, tmp_path: Path
) -> None:
    """With --optimal-perf every compiled plan is benchmarked with batches in flight and the one
    with the highest measured throughput is kept (a pipeline's rate, not a lone batch's latency)."""
    out = tmp_path / "out"
    proc, _ = shard(model, config, out, 5, "--optimal-perf", "--max-attempts", "4")
    assert proc.returncode == 0, proc.stderr
    data = report(out)
    ok = [a for a in data["attempts"] if a["outcome"] == "ok"]
    assert len(ok) >= 2 and all(a["benchmark"] and a["benchmark"]["latency_s"] > 0 for a in ok)
    assert all(a["benchmark"]["in_flight"] >= 2 * 5 for a in ok)  # five stages, each kept busy
    best = max(ok, key=lambda a: a["benchmark"]["throughput_per_s"])
    assert data["plan"]["digest"] == best["plan_digest"]
    assert data["benchmark"]["throughput_per_s"] == best["benchmark"]["throughput_per_s"]


@pytest.mark.parametrize(
    ("setting", "env_extra", "has"),
    [("ipus = 0", {}, 0), ("", {"FAKE_POPRT_IPUS": "4"}, 4)],
    ids=["compile-only", "counted-too-few"],
)
def test_optimal_perf_without_enough_ipus_keeps_the_best_predicted_and_says_so(
    model: Path, config: Path, tmp_path: Path, setting: str, env_extra: dict[str, str], has: int
) -> None:
    """No benchmark can attach (``[poprt] ipus = 0``, or a host counted with fewer IPUs than the
    plan's 5 devices): the compiles stand, the plan with the best predicted time is kept, and
    each attempt says no measurement was possible."""
    config.write_text(CONFIG + f"\n[poprt]\n{setting}\n")
    out = tmp_path / "out"
    proc, _ = shard(
        model, config, out, 5, "--optimal-perf", "--max-attempts", "3", env_extra=env_extra
    )
    assert proc.returncode == 0, proc.stderr
    data = report(out)
    ok = [a for a in data["attempts"] if a["outcome"] == "ok"]
    assert ok and not any(a["benchmark"] for a in ok)
    assert all(
        f"no measurement possible: the plan runs on 5 IPUs, this host has {has}" in a["message"]
        for a in ok
    ), ok
    best = min(ok, key=lambda a: (a["predicted_bottleneck_s"], a["index"]))
    assert data["plan"]["digest"] == best["plan_digest"]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/compiles.py's CNN: one late conv needs 62% of a 24-tile device by the model."""
    path = tmp_path_factory.mktemp("prove-cnn") / "cnn.onnx"
    return examples.save(examples.cnn(blocks=8, channels=64), path)


def test_a_node_too_large_alone_is_proven_by_compiling_it_alone(
    cnn: Path, config: Path, tmp_path: Path
) -> None:
    """Weights ×1.3 put the conv over a device by itself. The probe compiles the conv alone on one
    IPU at the lowest AMP the config allows (0.1); its overflow proves "no number of devices helps"
    (exit 3, grounds ``probe``), and the search stops there."""
    out = tmp_path / "out"
    proc, compiles = shard(cnn, config, out, 8, truth={"weight_factor": 1.3})
    assert proc.returncode == 3, proc.stderr
    probes = [c for c in compiles if c["options"]["num_ipus"] == 1]
    assert len(probes) == 1 and probes[0]["options"]["available_memory_proportion"] == 0.1
    assert len(compiles) <= 2
    assert "'/block5/conv2/Conv' compiled alone on one device" in proc.stderr
    assert "no number of devices helps" in proc.stderr and "--devices" not in proc.stderr
    data = report(out)
    assert data["verdict"] == {"proven": True, "grounds": "probe"}
    probe = next(a for a in data["attempts"] if a["label"].startswith("probe"))
    assert probe["outcome"] == "oom" and probe["predicted_stage_times_s"] == [0.0]


def test_a_probe_that_fits_is_evidence_never_the_result(
    cnn: Path, config: Path, tmp_path: Path
) -> None:
    """Under the default truth the conv fits alone: the probe compiles, and the job's result is
    the 9-device plan (its model annotated for 9 IPUs), not the one-node probe."""
    out = tmp_path / "out"
    proc, compiles = shard(cnn, config, out, 9)
    assert proc.returncode == 0, proc.stderr
    data = report(out)
    probes = [a for a in data["attempts"] if a["label"].startswith("probe")]
    assert len(probes) == 1 and probes[0]["outcome"] in ("ok", "cancelled")
    assert not data["attempts"][data["chosen_attempt"]]["label"].startswith("probe")
    assert len(compiles) <= 2 and any(c["options"]["num_ipus"] == 9 for c in compiles)
    assert data["plan"]["devices"] == 9


def test_a_re_plan_waits_for_the_compile_still_running(tmp_path: Path, config: Path) -> None:
    """The bench's 8-layer transformer under weights ×1.3 on 5 devices: the plan and the
    speculative margin both overflow. The re-plan starts only after both finished, so it is
    planned with both overflows."""
    model = examples.save(examples.transformer(layers=8, hidden=256), tmp_path / "transformer.onnx")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_POPRT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE), str(REPO)]),
        FAKE_POPRT_TILES=str(TILES),
        FAKE_POPRT_TRUTH=json.dumps({"weight_factor": 1.3}),
    )
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "sharderd.cli", "shard", str(model), "--devices", "5"),
            *("--backend", "poprt", "--config", str(config), "--out", str(out)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a loaded machine; a hang still ends the test
        check=False,
    )
    events = [
        line.split()[:2]
        for line in proc.stderr.splitlines()
        if line.startswith(("[attempt.started]", "[attempt.finished]"))
    ]
    assert events[:2] == [["[attempt.started]", "attempt=0"], ["[attempt.started]", "attempt=1"]]
    attempts = report(out)["attempts"]
    assert attempts[1]["label"].startswith("speculative") and attempts[1]["outcome"] == "oom"
    later = events.index(["[attempt.started]", "attempt=2"])
    finished = {e[1] for e in events[:later] if e[0] == "[attempt.finished]"}
    assert finished == {"attempt=0", "attempt=1"}


def test_an_estimate_that_rules_every_split_out_is_proven_by_the_probe(
    cnn: Path, config: Path, tmp_path: Path
) -> None:
    """On 5 devices the estimate (weights and code × margin) rules every split out before any
    compile: no proof. The probe compiles the large conv alone at the lowest AMP; where its
    biggest op overflows alone (40% of tiles), that is the proof (exit 3, one compile), and where it
    fits alone the search lets the compiler judge the least overfull split without the margin, and
    the answer stays "not proven" (exit 5) when it overflows."""
    out = tmp_path / "out"
    proc, compiles = shard(cnn, config, out, 5, truth={"op_tiles": 0.4})
    assert proc.returncode == 3, proc.stderr
    assert [c["options"]["num_ipus"] for c in compiles] == [1]
    assert report(out)["verdict"] == {"proven": True, "grounds": "probe"}
    out = tmp_path / "fits"
    proc, compiles = shard(cnn, config, out, 5)
    assert proc.returncode == 5, proc.stderr
    ipus = sorted(c["options"]["num_ipus"] for c in compiles)
    assert ipus[0] == 1 and ipus.count(1) == 1 and len(ipus) <= 3
    assert "not proven" in proc.stderr


def test_a_probe_out_of_host_stream_memory_is_no_proof(
    cnn: Path, config: Path, tmp_path: Path
) -> None:
    """The probe above, but every compile fails on a host stream's buffer: the probe feeds its
    node's inputs from the host, which no split does, so its overflow proves nothing (exit 5)."""
    out = tmp_path / "out"
    proc, compiles = shard(cnn, config, out, 8, truth={"weight_factor": 1.3}, mode="stream")
    assert proc.returncode == 5, proc.stderr
    assert any(c["options"]["num_ipus"] == 1 for c in compiles)
    assert "ran out of host-stream memory" in proc.stderr
    assert report(out)["verdict"] == {"proven": False, "grounds": None}
