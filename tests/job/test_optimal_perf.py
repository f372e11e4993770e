"""--optimal-perf end to end, on a runtime where latency and throughput disagree: the kept plan is
the one with the highest measured throughput, not the fastest lone batch nor the best prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sharderd import examples
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest, BenchmarkResult
from sharderd.config import load_config, search_options
from sharderd.job import prove
from sharderd.job.run import JobSpec, shard_job


@pytest.mark.anyio
async def test_optimal_perf_keeps_the_highest_throughput_where_latency_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every later compile is slower alone and faster with batches in flight (a split with big
    boundary copies, as on a pipeline): the kept plan is the last one, while a ranking by latency
    (or by the first, best-predicted plan) would keep the first."""
    compiled: list[AttemptRequest] = []

    async def runtime(request: AttemptRequest, workdir: Path, **_: Any) -> AttemptOutcome:
        compiled.append(request)
        k = len(compiled)
        bench = BenchmarkResult(latency_s=1e-3 * k, throughput_per_s=1000.0 * k, runs=10)
        return AttemptOutcome("ok", "fake runtime", benchmark=bench)

    monkeypatch.setattr(prove, "run_attempt", runtime)
    model = examples.save(
        examples.transformer(layers=4, hidden=64, heads=4, seq=16, vocab=200), tmp_path / "m.onnx"
    )
    config = load_config(None)
    spec = JobSpec(
        model=model,
        out_dir=tmp_path / "out",
        stem="m",
        devices=3,
        config=config,
        search=search_options(
            config, backend="onnxruntime", optimal_perf=True, max_attempts=4, parallel=1
        ),
    )
    result = await shard_job(
        spec, pool=AttemptPool(1), workdir=tmp_path / "work", emit=lambda *_: None
    )
    attempts = [a for a in result.report["attempts"] if a["outcome"] == "ok"]
    assert len(attempts) >= 2, "the variants must be compiled for the ranking to matter"
    by_throughput = max(attempts, key=lambda a: a["benchmark"]["throughput_per_s"])
    by_latency = min(attempts, key=lambda a: a["benchmark"]["latency_s"])
    assert by_throughput is not by_latency
    assert result.report["chosen_attempt"] == by_throughput["index"]
    assert result.report["plan"]["digest"] == by_throughput["plan_digest"]
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["benchmark"]["throughput_per_s"] == by_throughput["benchmark"]["throughput_per_s"]
