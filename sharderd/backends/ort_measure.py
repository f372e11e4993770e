"""Stage times and pipeline throughput of one attempt, as the report's benchmark.

Latency is the sum of stage medians. Throughput comes from the stages running concurrently
(``ort_pipeline``); with ``low_memory`` the stage sessions never coexist, so it is estimated as
one batch per slowest stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sharderd.backends.ort_options import OrtOptions
from sharderd.backends.ort_pipeline import Step, iqr, time_pipeline
from sharderd.backends.ort_sessions import OrtSession
from sharderd.backends.protocol import BenchmarkResult
from sharderd.shard.split import StageModel

__all__ = ["stage_benchmark"]


def stage_benchmark(
    stages: Sequence[StageModel],
    sessions: Sequence[OrtSession],
    times: Sequence[np.ndarray],
    feeds: Mapping[str, Any],
    options: OrtOptions,
    details: dict[str, Any],
) -> BenchmarkResult:
    """The benchmark from per-stage ``times``; the pipeline runs when ``sessions`` are all alive.

    Adds ``stage_times_s``, ``stage_spread_s`` and ``pipeline`` to ``details``.
    """
    # Samples per run: the leading dim of the inputs, which a static batch fixes, not options.
    leading = [a.shape[0] for a in feeds.values() if np.ndim(a) > 0]
    samples = int(leading[0]) if leading else options.batch_size
    medians = [float(np.median(t)) for t in times]
    spreads = [iqr(t) for t in times]
    details["stage_times_s"] = medians
    details["stage_spread_s"] = spreads
    if sessions:
        timing = time_pipeline(
            [_step(session, stage) for stage, session in zip(stages, sessions, strict=True)],
            feeds,
            items=options.runs,
        )
        throughput = samples * timing.items_per_s
        details["pipeline"] = {
            "measured": True,
            "samples_per_run": samples,
            "items": timing.items,
            "wall_s": timing.wall_s,
            "throughput_per_s": throughput,
        }
    else:
        throughput = samples / max(medians) if max(medians) > 0 else 0.0
        details["pipeline"] = {
            "measured": False,
            "samples_per_run": samples,
            "throughput_per_s": throughput,
            "note": "low_memory: stage sessions never coexist; throughput = batch / slowest stage",
        }
    return BenchmarkResult(
        latency_s=sum(medians),
        throughput_per_s=throughput,
        runs=options.runs,
        stage_times_s=tuple(medians),
        spread_s=sum(spreads),
    )


def _step(session: OrtSession, stage: StageModel) -> Step:
    outputs, inputs = list(stage.outputs), stage.inputs

    def step(env: Mapping[str, Any]) -> Mapping[str, Any]:
        values = session.run(outputs, {name: env[name] for name in inputs})
        return {**env, **dict(zip(outputs, values, strict=True))}

    return step
