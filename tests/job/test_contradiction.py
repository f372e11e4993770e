"""A compile that contradicts a probe's proof: the compile wins, and the report and the log say
so (a scripted compiler: the plan fits while the probe, one node alone, runs out of memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from job.test_prove import CONFIG

from sharderd import examples
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.config import load_config, search_options
from sharderd.job import prove, run
from sharderd.job.run import JobSpec, shard_job
from sharderd.plan.observations import OomInfo

TILE = 638_976


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # as the CLI and the daemon run (the trio pairing here cannot cancel a scope)


async def _shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, optimal_perf: bool
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """The CNN on 9 mini devices: the plan (9 IPUs) fits at once; the probe of its late conv
    (1 IPU) runs out of memory on a tile, after the plan's outcome is in."""
    plan_done = anyio.Event()

    async def compiler(request: AttemptRequest, workdir: Path, **_: Any) -> AttemptOutcome:
        if request.num_devices > 1:
            plan_done.set()
            return AttemptOutcome("ok", "compiled (scripted)")
        await plan_done.wait()
        oom = OomInfo("tile", 0, 3, int(1.2 * TILE), TILE)
        return AttemptOutcome("oom", "Out of memory on tile 3 (scripted)", oom=oom)

    monkeypatch.setattr(prove, "run_attempt", compiler)
    monkeypatch.setattr(run, "resolve_backend", lambda *_, **__: "poprt")
    (tmp_path / "sharderd.toml").write_text(CONFIG)
    config = load_config(tmp_path / "sharderd.toml")
    model = examples.save(examples.cnn(blocks=8, channels=64), tmp_path / "cnn.onnx")
    spec = JobSpec(
        model=model,
        out_dir=tmp_path / "out",
        stem="cnn",
        devices=9,
        config=config,
        search=search_options(config, backend="poprt", optimal_perf=optimal_perf, parallel=2),
    )
    events: list[tuple[str, dict[str, Any]]] = []
    result = await shard_job(
        spec,
        pool=AttemptPool(2),
        workdir=tmp_path / "work",
        emit=lambda event, fields: events.append((event, dict(fields))),
    )
    return result.report, events


@pytest.mark.anyio
async def test_a_fit_contradicting_a_probe_proof_wins_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --optimal-perf the search waits for the running probe after the fit: its overflow
    would prove "does not fit", the fit says otherwise; the job compiles, report.json's
    ``verdict.contradiction`` names both, and a ``verdict.contradiction`` line is logged."""
    report, events = await _shard(tmp_path, monkeypatch, optimal_perf=True)
    assert report["status"] == "compiled"
    outcomes = [(a["label"].split(":")[0], a["outcome"]) for a in report["attempts"]]
    assert outcomes == [("plan", "ok"), ("probe", "oom")]
    verdict = report["verdict"]
    assert verdict["proven"] is False and verdict["grounds"] is None
    contradiction = verdict["contradiction"]
    assert contradiction["probe_attempt"] == 1 and contradiction["fitted_attempt"] == 0
    assert "'/block5/conv2/Conv' compiled alone on one device" in contradiction["proof"]
    logged = [fields for event, fields in events if event == "verdict.contradiction"]
    assert logged == [{"probe": 1, "fitted": 0, "proof": contradiction["proof"]}]


@pytest.mark.anyio
async def test_a_fit_before_the_probe_finished_contradicts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --optimal-perf the fit ends the search and the probe is stopped unfinished: no
    overflow was reported, so there is nothing to contradict."""
    report, events = await _shard(tmp_path, monkeypatch, optimal_perf=False)
    assert report["status"] == "compiled" and report["verdict"] is None
    assert report["attempts"][1]["outcome"] in ("cancelled", None)
    assert not [e for e, _ in events if e == "verdict.contradiction"]
