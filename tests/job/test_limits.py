"""A planning worker's limits: past its time budget (summed over the job) or its memory, the real
worker process is killed and the call raises ``PlanningLimitError`` naming the limit and its key.

The worker is the real ``python -m sharderd.job.planworker``; a ``sitecustomize`` hook replaces
``PlanService.summary`` with one that sleeps or holds memory for a known time, then answers an
expected error, so the numbers are the test's own and not a model's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest
from daemon_helpers import planworker_hook

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.errors import PlanningLimitError, SharderdError
from sharderd.job.limits import PlanningLimits
from sharderd.job.session import WorkerSession
from sharderd.procfs import resident_bytes
from sharderd.target import BUILTIN_TARGETS

TARGET = BUILTIN_TARGETS["ipu-mk2"]
MB = 1024 * 1024

_SUMMARY_HOOK = """
import sharderd.job.session as _session
from sharderd.errors import SharderdError as _Answer
def _summary(self):
    held = bytearray(b"x") * (int(os.environ.get("HOLD_MB", "0")) * 1048576)
    time.sleep(float(os.environ.get("SUMMARY_S", "0")))
    raise _Answer(f"summary answered after holding {len(held)} bytes")
_session.PlanService.summary = _summary
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return examples.save(examples.chain(nodes=4, hidden=4), tmp_path / "m.onnx")


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    return {**os.environ, **planworker_hook(tmp_path, _SUMMARY_HOOK), **values}


async def _start(
    model: Path, tmp_path: Path, limits: PlanningLimits, **values: str
) -> WorkerSession:
    return await WorkerSession.start(
        model,
        PlanConfig(),
        TARGET,
        stderr_path=tmp_path / "err",
        env=_env(tmp_path, **values),
        limits=limits,
    )


@pytest.mark.anyio
async def test_time_is_summed_over_the_calls_and_the_worker_is_killed_past_it(
    model: Path, tmp_path: Path
) -> None:
    """Each summary takes 2 s, far inside the 10 s budget alone; their sum goes past it, within
    5 calls. The call that does is cut at the budget, the worker is dead, and later calls say so."""
    limits = PlanningLimits(10.0, 0, "/etc/sharderd/sharderd.toml")
    session = await _start(model, tmp_path, limits, SUMMARY_S="2")
    try:
        answered = 0
        with pytest.raises(PlanningLimitError) as info:
            for _ in range(6):
                try:
                    await session.summary()
                except PlanningLimitError:
                    raise
                except SharderdError as answer:
                    assert "summary answered" in answer.message
                answered += 1
        process = session._process
        assert await process.wait() != 0  # killed, not waited for to finish
        with pytest.raises(PlanningLimitError):
            await session.summary()
    finally:
        await session.aclose()
    assert 1 <= answered <= 4
    err = info.value
    assert (err.limit, err.key, err.allowed, err.reason) == (
        "time",
        "planning_timeout",
        10.0,
        "planning_limit",
    )
    assert 10.0 <= err.used < 11.5
    assert str(model) in err.message and "[daemon] planning_timeout" in err.message
    assert err.hint is not None
    assert (
        "raise planning_timeout in the [daemon] table of /etc/sharderd/sharderd.toml (now 10 s)"
        in err.hint
    )


@pytest.mark.anyio
async def test_a_call_inside_the_budget_is_answered(model: Path, tmp_path: Path) -> None:
    limits = PlanningLimits(60.0, 0)
    session = await _start(model, tmp_path, limits, SUMMARY_S="2")
    try:
        for _ in range(2):
            with pytest.raises(SharderdError, match="summary answered"):
                await session.summary()
    finally:
        await session.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize(("hold_mb", "stopped"), [(64, False), (512, True)])
async def test_memory_past_the_limit_kills_the_worker(
    model: Path, tmp_path: Path, hold_mb: int, stopped: bool
) -> None:
    """The limit is the idle worker's resident memory + 256 MiB; holding 64 MiB for a second is
    answered, holding 512 MiB (for 5 s) is stopped at once with the reading that went past it."""
    probe = await _start(model, tmp_path, PlanningLimits(60.0, 0))
    baseline = resident_bytes(probe._process.pid)
    await probe.aclose()
    assert baseline is not None
    limit = baseline + 256 * MB
    hold_s = 5.0 if stopped else 1.0
    session = await _start(
        model, tmp_path, PlanningLimits(60.0, limit), HOLD_MB=str(hold_mb), SUMMARY_S=str(hold_s)
    )
    try:
        started = time.monotonic()
        if not stopped:
            with pytest.raises(SharderdError, match=f"holding {hold_mb * MB} bytes"):
                await session.summary()
            return
        with pytest.raises(PlanningLimitError) as info:
            await session.summary()
        assert time.monotonic() - started < hold_s - 1.0  # stopped while holding it, not after
        assert await session._process.wait() != 0
    finally:
        await session.aclose()
    err = info.value
    assert (err.limit, err.key, err.allowed) == ("memory", "planning_memory_bytes", limit)
    assert limit < err.used <= baseline + (hold_mb + 64) * MB
    assert f"planning_memory_bytes = {limit}" in err.message
    assert err.hint is not None and "the daemon's configuration file" in err.hint


@pytest.mark.anyio
async def test_cancelling_a_limited_call_is_not_a_limit(model: Path, tmp_path: Path) -> None:
    """A job cancelled while its worker answers raises the cancellation, not PlanningLimitError."""
    session = await _start(model, tmp_path, PlanningLimits(60.0, 1 << 40), SUMMARY_S="30")
    try:
        with anyio.move_on_after(1.0) as scope:
            await session.summary()
        assert scope.cancelled_caught
    finally:
        await session.aclose()
