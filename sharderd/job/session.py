"""A planning session: the model analysed once, then re-planned on demand with new corrections.

``PlanService`` is the synchronous core. ``LocalSession`` runs it in the caller's process (the
one-shot CLI); ``WorkerSession`` runs it in a child process speaking JSON lines on stdin/stdout
(``python -m sharderd.job.planworker``), so the daemon's event loop never blocks on a huge
model and a crash in the engine costs one job, not the daemon. Both return the same frozen values
(``job.codec``: ``ModelSummary``, ``Planned``, ``Probed``); only the worker's pipe encodes them.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import anyio
from anyio.abc import Process

from sharderd.config import PlanConfig
from sharderd.errors import OutputWriteError, PlanningLimitError, WorkerDiedError, sole_exception
from sharderd.graph.analyze import Analysis
from sharderd.job.codec import (
    ModelSummary,
    Planned,
    Probed,
    decode_content,
    decode_error,
    decode_planned,
    decode_probed,
    decode_summary,
)
from sharderd.job.limits import MemoryWatch, PlanningLimits
from sharderd.plan.content import ContentCorrection
from sharderd.plan.serialize_choice import BottleneckTrial
from sharderd.report.build import model_facts
from sharderd.shard.serialize import Serialized
from sharderd.target import Target

__all__ = [
    "LocalSession",
    "PlanRequest",
    "PlanService",
    "PlanSession",
    "Planned",
    "ProbeRequest",
    "Probed",
    "Serialize",
    "WorkerSession",
]


@dataclass(frozen=True, slots=True)
class PlanRequest:
    devices: int
    safety_margin: float
    memory_scale: tuple[float, ...] | None = None
    orders: tuple[str, ...] | None = None
    write_dir: str | None = None
    """Write the annotated model (+ linked external data, YAML) here when set."""
    stem: str = "model"
    link_external: bool = True
    measured_times: Mapping[str, float] | None = None
    """Node name → seconds from a profile: plan on measured time instead of FLOPs."""
    content: ContentCorrection | None = None
    """Factors on the bytes of nodes a compile measured (``plan.content``)."""
    stage_amps: tuple[float | None, ...] | None = None
    """Per stage, the ``available_memory_proportion`` written on its conv/matmul nodes (None:
    the session's option); only what is written changes, never the split."""
    matmul_serialization: tuple[tuple[str, int], ...] = ()
    """MatMuls written with PopART's serialization, (node, factor) (``plan.probe``);
    only what is written changes, never the split."""
    max_devices: int | None = None
    """Set when the job asked for ``devices = "auto"``: stamped on the plan (``Plan.max_devices``),
    ``devices`` being the count chosen."""
    fewest: bool = False
    """Also find the fewest devices that keep the plan's throughput (``Plan.fewest_devices``):
    more plans, so asked for only by the plans that reach the report or choose ``auto``."""


@dataclass(frozen=True, slots=True)
class Serialize:
    """Rewrite nodes into pieces before analysis, as ``serialize_for_devices`` decides for
    ``devices``; the serialized copy is written under ``work_dir``."""

    devices: int
    work_dir: str


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """Pick the node to compile alone and write it to ``write_path``."""

    write_path: str
    matmul_serialization: tuple[tuple[str, int], ...] = ()
    """Write it with PopART's serialization when it is named here (the serialized probe)."""


class PlanService:
    """Holds one analysed model; every method returns frozen values or raises SharderdError."""

    def __init__(
        self,
        model: Path,
        plan_config: PlanConfig,
        target: Target,
        serialize: Serialize | None = None,
    ) -> None:
        self.model_path = model
        self.plan_config = plan_config
        self.target = target
        self.serialize = serialize
        self._analysis: Analysis | None = None
        self._serialized: tuple[Serialized, ...] = ()
        self._trial: BottleneckTrial | None = None
        self._analyze_s = 0.0

    @property
    def analysis(self) -> Analysis:
        """The model analysed, after ``serialize``'s rewrites when set (the file they wrote)."""
        if self._analysis is None:
            from sharderd.engine import analyze_file
            from sharderd.shard.serialize_bottleneck import serialize_for_devices

            started = time.perf_counter()
            if self.serialize is None:
                self._analysis = analyze_file(self.model_path, self.plan_config)
            else:
                done = serialize_for_devices(
                    self.model_path,
                    self.plan_config,
                    self.target,
                    self.serialize.devices,
                    Path(self.serialize.work_dir),
                )
                self._serialized, self._trial = done.records, done.trial
                self._analysis = done.analysis
            self._analyze_s = time.perf_counter() - started
        return self._analysis

    def summary(self) -> ModelSummary:
        analysis = self.analysis
        shapes = {k: tuple(int(d) for d in v) for k, v in analysis.shapes.input_shapes.items()}
        return ModelSummary(
            model_facts(analysis),
            tuple(analysis.warnings),
            analysis.precision,
            shapes,
            self._analyze_s,
            self._serialized,
            self._trial,
        )

    def plan(self, request: PlanRequest) -> Planned:
        from sharderd.engine import make_plan, write_shard_files

        plan = make_plan(
            self.analysis,
            self.target,
            request.devices,
            self.plan_config,
            memory_scale=request.memory_scale,
            safety_margin=request.safety_margin,
            orders=request.orders,
            measured_times=request.measured_times,
            content=request.content,
            fewest=request.fewest,
        )
        if request.max_devices is not None:
            plan = replace(plan, max_devices=request.max_devices)
        if request.write_dir is None:
            return Planned(plan)
        out = Path(request.write_dir)
        try:
            files = write_shard_files(
                self.analysis,
                plan,
                out,
                request.stem,
                link_external=request.link_external,
                stage_amps=request.stage_amps,
                matmul_serialization=dict(request.matmul_serialization),
            )
        except OSError as exc:
            raise OutputWriteError.of(exc, "the sharded model", out) from None
        return Planned(plan, files)

    def probe(self, request: ProbeRequest) -> Probed | None:
        """The node worth compiling alone, with its model written, or None (``plan.probe``)."""
        from sharderd.plan.probe import probe_factor, probe_target
        from sharderd.shard.node_model import write_node_model

        found = probe_target(self.analysis, self.target)
        if found is None:
            return None
        name, view = found
        path = Path(request.write_path)
        serial = dict(request.matmul_serialization)
        try:
            write_node_model(self.analysis, view.runs[0][0], path, serial)
        except OSError as exc:
            raise OutputWriteError.of(exc, "the probe model", path) from None
        factor = probe_factor(self.analysis, view.runs[0][0])
        return Probed(name, view.predicted, view, path, factor)


class PlanSession(Protocol):
    async def summary(self) -> ModelSummary: ...
    async def plan(self, request: PlanRequest) -> Planned: ...
    async def probe(self, request: ProbeRequest) -> Probed | None: ...
    async def aclose(self) -> None: ...


class LocalSession:
    """In-process: fine where nothing else shares the event loop for long (the one-shot CLI)."""

    def __init__(self, service: PlanService) -> None:
        self.service = service

    async def summary(self) -> ModelSummary:
        return self.service.summary()

    async def plan(self, request: PlanRequest) -> Planned:
        await anyio.lowlevel.checkpoint()
        return self.service.plan(request)

    async def probe(self, request: ProbeRequest) -> Probed | None:
        await anyio.lowlevel.checkpoint()
        return self.service.probe(request)

    async def aclose(self) -> None:
        return None


class WorkerSession:
    """The plan service in a child process; requests and answers are JSON lines.

    With ``limits``, the worker is killed once its answers have taken ``limits.seconds`` in all or
    it holds more than ``limits.memory_bytes``; that call and every later one raise
    ``PlanningLimitError`` (``job/limits.py``).
    """

    def __init__(
        self,
        process: Process,
        stderr_path: Path,
        model: Path | None = None,
        limits: PlanningLimits | None = None,
    ) -> None:
        self._process = process
        self._stderr_path = stderr_path
        self._buffer = b""
        self._lock = anyio.Lock()
        self._model = model
        self._limits = limits
        self._spent = 0.0
        self._stopped: PlanningLimitError | None = None

    @classmethod
    async def start(
        cls,
        model: Path,
        plan_config: PlanConfig,
        target: Target,
        *,
        stderr_path: Path,
        env: Mapping[str, str] | None = None,
        serialize: Serialize | None = None,
        limits: PlanningLimits | None = None,
    ) -> WorkerSession:
        """Start the worker; its stderr goes to ``stderr_path`` (a pipe nobody reads could block it)."""
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with open(stderr_path, "ab") as stderr:
            process = await anyio.open_process(
                [sys.executable, "-m", "sharderd.job.planworker"],
                start_new_session=True,
                stderr=stderr,
                env=dict(env) if env is not None else None,
            )
        session = cls(process, stderr_path, model, limits)
        init = {
            "model": str(model),
            "plan": {**asdict(plan_config), "dims": dict(plan_config.dims)},
            "target": asdict(target),
            "serialize": None if serialize is None else asdict(serialize),
        }
        try:
            await session._call(init)
        except BaseException:
            await session.aclose()  # a worker that died or went past a limit is reaped here
            raise
        return session

    async def _call(self, message: Mapping[str, Any]) -> Any:
        async with self._lock:
            if self._stopped is not None:
                raise self._stopped
            if self._limits is None:
                line = await self._exchange(message)
            else:
                line = await self._exchange_within(message, self._limits)
        answer = json.loads(line)
        if not answer.get("ok"):
            raise decode_error(answer.get("error", {}))
        return answer["result"]

    async def _exchange_within(self, message: Mapping[str, Any], limits: PlanningLimits) -> bytes:
        """``_exchange`` under the job's time budget and memory limit; past either, kill the worker."""
        started = anyio.current_time()
        watch = MemoryWatch(self._process.pid, limits.memory_bytes)
        line: bytes | None = None
        with anyio.CancelScope(deadline=started + limits.seconds - self._spent) as scope:
            try:
                async with anyio.create_task_group() as tg:
                    if limits.memory_bytes:
                        tg.start_soon(watch.run, scope)
                    line = await self._exchange(message)
                    tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:  # the worker died: its error, as without limits
                raise sole_exception(group) from None
        self._spent += anyio.current_time() - started
        if line is not None:
            return line
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        model = str(self._model or "the model")
        self._stopped = (
            limits.time_error(model, self._spent)
            if watch.over is None
            else limits.memory_error(model, watch.over)
        )
        raise self._stopped

    async def _exchange(self, message: Mapping[str, Any]) -> bytes:
        """Send one request, read its one answer line."""
        assert self._process.stdin is not None and self._process.stdout is not None
        await self._process.stdin.send((json.dumps(message) + "\n").encode())
        while b"\n" not in self._buffer:
            try:
                chunk = await self._process.stdout.receive()
            except anyio.EndOfStream:
                code = await self._process.wait()
                raise WorkerDiedError(
                    f"the planning worker died (exit status {code}): {self._stderr_tail()}",
                    exit_status=code if code >= 0 else None,
                    signal=-code if code < 0 else None,
                ) from None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stderr_tail(self, limit: int = 2000) -> str:
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - limit))
                return f.read().decode(errors="replace").strip() or "no output on stderr"
        except OSError:
            return "no output on stderr"

    async def summary(self) -> ModelSummary:
        return decode_summary(await self._call({"op": "summary"}))

    async def plan(self, request: PlanRequest) -> Planned:
        return decode_planned(await self._call({"op": "plan", **asdict(request)}))

    async def probe(self, request: ProbeRequest) -> Probed | None:
        return decode_probed(await self._call({"op": "probe", **asdict(request)}))

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
            await self._process.wait()
            await self._process.aclose()


def plan_request_from(data: Mapping[str, Any]) -> PlanRequest:
    fields = dict(data)
    fields.pop("op", None)
    for key in ("memory_scale", "orders", "stage_amps"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    fields["matmul_serialization"] = _pairs(fields.get("matmul_serialization"))
    fields["content"] = decode_content(fields.get("content"))
    return PlanRequest(**fields)


def probe_request_from(data: Mapping[str, Any]) -> ProbeRequest:
    return ProbeRequest(str(data["write_path"]), _pairs(data.get("matmul_serialization")))


def _pairs(data: Any) -> tuple[tuple[str, int], ...]:
    return tuple((str(name), int(k)) for name, k in data or ())
