"""Plan sessions: the worker process gives the same answers as the in-process service."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import anyio
import onnx
import pytest

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.errors import (
    ModelInvalidError,
    NotProvenError,
    PlanInfeasibleError,
    WorkerDiedError,
)
from sharderd.job.session import (
    LocalSession,
    PlanRequest,
    PlanService,
    ProbeRequest,
    Serialize,
    WorkerSession,
)
from sharderd.plan.bounds import memory_floor
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
    assert replace(remote_summary, analyze_s=0.0) == replace(local_summary, analyze_s=0.0)
    assert remote.plan.digest == local.plan.digest
    assert remote.plan.bottleneck_s == pytest.approx(local.plan.bottleneck_s)
    assert remote.plan.stages == local.plan.stages and remote.plan.bounds == local.plan.bounds
    assert (remote.plan.assignment == local.plan.assignment).all()
    assert remote.files is not None and local.files is not None
    assert remote.files.model.is_file() and remote.files.sharding_yaml.is_file()
    assert remote.files.routed == local.files.routed


@pytest.mark.anyio
async def test_worker_errors_keep_their_type(model: Path, tmp_path: Path) -> None:
    """A plan the estimate rules out comes back as NotProvenError with its numbers, one the weights
    rule out as PlanInfeasibleError with its grounds; a bad model as ModelInvalidError."""
    tiny = replace(TARGET, memory_bytes=1_000_000)
    worker = await WorkerSession.start(model, PlanConfig(), tiny, stderr_path=tmp_path / "err")
    try:
        with pytest.raises(NotProvenError) as info:
            await worker.plan(PlanRequest(1, 1.15))
        assert info.value.min_devices is not None and info.value.min_devices > 1
    finally:
        await worker.aclose()
    none = replace(TARGET, memory_bytes=1_000)
    worker = await WorkerSession.start(model, PlanConfig(), none, stderr_path=tmp_path / "err1")
    try:
        with pytest.raises(PlanInfeasibleError) as proof:
            await worker.plan(PlanRequest(1, 1.15))
        assert proof.value.grounds in ("weights_total", "node_weights")
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


@pytest.mark.anyio
async def test_worker_and_local_sessions_write_the_same_probe(model: Path, tmp_path: Path) -> None:
    """On a target where one node needs most of a device, both sessions pick it and write it
    alone; on the real target no node is worth a probe."""
    local = PlanService(model, PlanConfig(), TARGET)
    assert local.probe(ProbeRequest(str(tmp_path / "none.onnx"))) is None
    heaviest = float(memory_floor(local.analysis, TARGET).node_bytes.max())
    small = replace(TARGET, memory_bytes=int(heaviest / 0.8))
    worker = await WorkerSession.start(model, PlanConfig(), small, stderr_path=tmp_path / "err")
    try:
        remote = await worker.probe(ProbeRequest(str(tmp_path / "w" / "probe.onnx")))
    finally:
        await worker.aclose()
    mine = await LocalSession(PlanService(model, PlanConfig(), small)).probe(
        ProbeRequest(str(tmp_path / "l" / "probe.onnx"))
    )
    assert remote is not None and mine is not None
    assert (remote.name, remote.need, remote.view) == (mine.name, mine.need, mine.view)
    assert remote.need == pytest.approx(0.8) and remote.view.predicted == remote.need
    for result in (remote, mine):
        written = onnx.load(str(result.model))
        assert [n.name for n in written.graph.node][-1] == result.name


@pytest.mark.anyio
async def test_worker_and_local_sessions_serialize_the_same_way(tmp_path: Path) -> None:
    """With ``serialize``, both sessions rewrite the wide head before analysing (the worker in its
    own process), report the same records and plan the pieces."""
    model = examples.save(examples.wide_head(), tmp_path / "wide.onnx")
    cpu = BUILTIN_TARGETS["cpu"]
    request = PlanRequest(4, 1.15)
    worker = await WorkerSession.start(
        model,
        PlanConfig(),
        cpu,
        stderr_path=tmp_path / "err",
        serialize=Serialize(4, str(tmp_path / "ws")),
    )
    try:
        remote_summary = await worker.summary()
        remote = await worker.plan(request)
    finally:
        await worker.aclose()
    service = PlanService(model, PlanConfig(), cpu, Serialize(4, str(tmp_path / "ls")))
    local_summary = await LocalSession(service).summary()
    [record] = remote_summary.serialized
    assert record.reason == "bottleneck" and record.node == "MatMul_head"
    assert remote_summary.serialized == local_summary.serialized
    assert remote_summary.facts["sha256"] == local_summary.facts["sha256"]  # the same rewrite
    names = service.analysis.flow.node_names
    assert set(record.piece_nodes) <= set(names) and "MatMul_head" not in names
    assert len(remote.plan.assignment) == len(names)  # the worker planned the pieces too
    plain = LocalSession(PlanService(model, PlanConfig(), cpu))
    assert (await plain.summary()).serialized == ()
