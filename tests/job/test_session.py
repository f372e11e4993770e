"""Plan sessions: the worker process gives the same answers as the in-process service."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.errors import ModelInvalidError, PlanInfeasibleError, WorkerDiedError
from sharderd.job.session import LocalSession, PlanRequest, PlanService, WorkerSession
from sharderd.target import BUILTIN_TARGETS

TARGET = BUILTIN_TARGETS["ipu-mk2"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return examples.save(
        examples.transformer(layers=2, hidden=32, heads=4, seq=8, vocab=50), tmp_path / "t.onnx"
    )


@pytest.mark.anyio
async def test_worker_and_local_sessions_agree(model: Path, tmp_path: Path) -> None:
    """The same request gives the same plan digest, bottleneck and files in both sessions."""
    request = PlanRequest(3, 1.15, None, None, write_dir=str(tmp_path / "w"), stem="t")
    worker = await WorkerSession.start(model, PlanConfig(), TARGET, stderr_path=tmp_path / "err")
    try:
        remote_summary = await worker.summary()
        remote = await worker.plan(request)
    finally:
        await worker.aclose()
    session = LocalSession(PlanService(model, PlanConfig(), TARGET))
    local_summary = await session.summary()
    local = await session.plan(replace(request, write_dir=str(tmp_path / "l")))
    assert remote_summary["model"] == local_summary["model"]
    assert remote["plan"]["digest"] == local["plan"]["digest"]
    assert remote["plan"]["bottleneck_s"] == pytest.approx(local["plan"]["bottleneck_s"])
    assert (
        Path(remote["files"]["model"]).is_file()
        and Path(remote["files"]["sharding_yaml"]).is_file()
    )


@pytest.mark.anyio
async def test_worker_errors_keep_their_type(model: Path, tmp_path: Path) -> None:
    """A plan that cannot fit comes back as PlanInfeasibleError with its numbers; a bad model as ModelInvalidError."""
    tiny = replace(TARGET, memory_bytes=1_000_000)
    worker = await WorkerSession.start(model, PlanConfig(), tiny, stderr_path=tmp_path / "err")
    try:
        with pytest.raises(PlanInfeasibleError) as info:
            await worker.plan(PlanRequest(1, 1.15))
        assert info.value.min_devices is not None and info.value.min_devices > 1
    finally:
        await worker.aclose()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    worker = await WorkerSession.start(bad, PlanConfig(), TARGET, stderr_path=tmp_path / "err2")
    try:
        with pytest.raises(ModelInvalidError, match="not an ONNX model"):
            await worker.summary()
    finally:
        await worker.aclose()


@pytest.mark.anyio
async def test_a_dead_worker_is_an_error_not_a_hang(model: Path, tmp_path: Path) -> None:
    """If the worker dies, the next call fails with the signal that killed it (a type the daemon
    retries on, not a message it parses), and closing leaves no process."""
    worker = await WorkerSession.start(model, PlanConfig(), TARGET, stderr_path=tmp_path / "err")
    await worker.summary()
    pid = worker._process.pid
    os.kill(pid, signal.SIGKILL)
    with anyio.fail_after(10), pytest.raises(WorkerDiedError, match="planning worker died") as died:
        await worker.plan(PlanRequest(2, 1.15))
    assert (died.value.signal, died.value.exit_status) == (signal.SIGKILL, None)
    await worker.aclose()
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )
