"""One compile attempt: request file in, a pool slot, a killable worker process, an outcome out.

The worker reports success or a compiler verdict (``ok``, ``oom``, ``invalid``) in
``result.json``; everything else (it hung, died, or left no readable result) is decided here from
the process's exit, so a broken worker is a ``crashed`` outcome with a reason, never an exception.

A poprt benchmark run on this host is two steps with separate limits: the compile holds a pool
slot (CPUs), then the run of its PopEF holds ``num_devices`` IPUs of ``pool.ipus`` (and no slot),
released when it ends or is killed, so concurrent jobs never attach to the same devices. When the
host has too few IPUs in all, the compile stands and its message says no measurement was possible.
On a cluster one task does both; it asks Ray for ``[cluster] ipu_resource`` instead.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

from sharderd.backends.pool import AttemptPool, ProcessResult, run_process
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest

__all__ = ["REQUEST_NAME", "RESULT_NAME", "WORKER_ARGV", "AttemptRunner", "run_attempt"]

REQUEST_NAME = "request.json"
RESULT_NAME = "result.json"
WORKER_ARGV: tuple[str, ...] = (sys.executable, "-m", "sharderd.backends.worker")
"""The worker command; the request and result paths are appended."""

_WORKER_OUTCOMES = frozenset({"ok", "oom", "invalid"})
"""What a worker may claim; ``crashed``, ``timeout`` and ``cancelled`` are the parent's to say."""


class AttemptRunner(Protocol):
    """Runs one granted attempt somewhere else (``sharderd.cluster``: a Ray task on another node)."""

    async def __call__(
        self,
        request: AttemptRequest,
        workdir: Path,
        *,
        job_id: str,
        timeout: float,
        kill_grace: float,
        argv_prefix: Sequence[str] | None,
    ) -> AttemptOutcome: ...


async def run_attempt(
    request: AttemptRequest,
    workdir: Path,
    *,
    pool: AttemptPool,
    job_id: str,
    priority: int = 0,
    timeout: float,
    kill_grace: float,
    env: Mapping[str, str] | None = None,
    argv_prefix: Sequence[str] | None = None,
    on_started: Callable[[int], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
) -> AttemptOutcome:
    """Run one worker for ``request`` in ``workdir`` once ``pool`` grants a slot.

    Args:
        request: Written to ``workdir/request.json`` for the worker.
        workdir: The attempt's own directory; ``result.json`` is expected there.
        pool: Bounds how many attempts run at once.
        job_id: For fairness between jobs in ``pool``.
        priority: Higher is granted a slot first.
        timeout: Seconds before the worker's process group gets SIGTERM.
        kill_grace: Seconds between SIGTERM and SIGKILL.
        env: Worker environment (default: ours); systemd variables are always removed.
        argv_prefix: Replaces :data:`WORKER_ARGV` (tests use a scripted fake worker).
        on_started: Called with the worker's pid (= its process group) once it is spawned.
        on_stderr: Called with each chunk of the worker's stderr as it arrives.

    Returns:
        The worker's outcome, or ``timeout``/``crashed`` with a reason, with ``duration_s``,
        ``returncode``, ``signal`` and ``stderr_tail`` filled in from the process.

    Raises:
        OSError: The worker command could not be spawned (a configuration error).

    Cancellation of the caller kills the worker's group and is re-raised; the caller records
    why it cancelled.
    """
    runner: AttemptRunner | None = pool.runner  # type: ignore[assignment]
    step = _Step(workdir, job_id, timeout, kill_grace, env, argv_prefix, on_started, on_stderr)
    slot = pool.slot(job_id=job_id, priority=priority)
    if runner is not None or not (request.backend == "poprt" and request.benchmark):
        return await step.run(request, slot, runner)
    compiled = await step.run(dataclasses.replace(request, benchmark=False), slot, None)
    if compiled.ipus_on_host is not None:
        pool.ipus.learn(compiled.ipus_on_host)
    if compiled.outcome != "ok":
        return compiled
    if not pool.ipus.can_hold(request.num_devices):
        return _noted(
            compiled,
            f"note: no measurement possible: the plan runs on {request.num_devices} IPUs, "
            f"this host has {pool.ipus.total or 0} ([poprt] ipus)",
        )
    ran = await step.run(
        dataclasses.replace(request, benchmark_only=True),
        pool.ipus.hold(request.num_devices),
        None,
    )
    if ran.outcome != "ok" or ran.benchmark is None:
        return _noted(compiled, f"note: the benchmark failed, the compile stands: {ran.message}")
    return dataclasses.replace(
        _noted(compiled, ran.message),
        benchmark=ran.benchmark,
        duration_s=compiled.duration_s + ran.duration_s,
    )


def _noted(outcome: AttemptOutcome, note: str) -> AttemptOutcome:
    return dataclasses.replace(outcome, message="\n".join(filter(None, [outcome.message, note])))


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    """One worker run of an attempt, in its folder, once ``gate`` (a slot, IPUs) is held."""

    workdir: Path
    job_id: str
    timeout: float
    kill_grace: float
    env: Mapping[str, str] | None
    argv_prefix: Sequence[str] | None
    on_started: Callable[[int], None] | None
    on_stderr: Callable[[bytes], None] | None

    async def run(
        self,
        request: AttemptRequest,
        gate: AbstractAsyncContextManager[None],
        runner: AttemptRunner | None,
    ) -> AttemptOutcome:
        if runner is not None:
            async with gate:
                return await runner(
                    request,
                    self.workdir,
                    job_id=self.job_id,
                    timeout=self.timeout,
                    kill_grace=self.kill_grace,
                    argv_prefix=self.argv_prefix,
                )
        request_path = self.workdir / REQUEST_NAME
        result_path = self.workdir / RESULT_NAME
        result_path.unlink(missing_ok=True)  # a stale result must never pass for this attempt's
        request.write(request_path)
        argv = [
            *(WORKER_ARGV if self.argv_prefix is None else self.argv_prefix),
            str(request_path),
            str(result_path),
        ]
        async with gate:
            proc = await run_process(
                argv,
                cwd=self.workdir,
                env=self.env,
                timeout=self.timeout,
                kill_grace=self.kill_grace,
                on_started=self.on_started,
                on_stderr=self.on_stderr,
            )
        return outcome_of(proc, result_path, timeout=self.timeout)


def outcome_of(proc: ProcessResult, result_path: Path, *, timeout: float) -> AttemptOutcome:
    """Decide an attempt's outcome from how its process ended and what it left behind."""
    facts: dict[str, Any] = {
        "returncode": proc.returncode,
        "signal": proc.signal,
        "stderr_tail": proc.stderr_tail,
        "duration_s": proc.duration_s,
    }
    if proc.timed_out:
        return AttemptOutcome(
            "timeout", f"no result within {timeout:g} s; process group killed", **facts
        )
    if proc.signal is not None:
        return AttemptOutcome("crashed", f"worker killed by {_signal_name(proc.signal)}", **facts)
    if result_path.exists():
        try:
            claimed = _read_outcome(result_path)
        except (OSError, ValueError, TypeError, KeyError) as err:
            return AttemptOutcome("crashed", f"unreadable result: {err}", **facts)
        return dataclasses.replace(claimed, **facts)
    if proc.returncode == 0:
        return AttemptOutcome("crashed", "worker exited without a result", **facts)
    last = _last_line(proc.stderr_tail)
    detail = f": {last}" if last else ""
    return AttemptOutcome(
        "crashed", f"worker exited with status {proc.returncode}{detail}", **facts
    )


def _read_outcome(path: Path) -> AttemptOutcome:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    outcome = AttemptOutcome.from_json(data)
    if outcome.outcome not in _WORKER_OUTCOMES:
        raise ValueError(f"a worker may not claim outcome {outcome.outcome!r}")
    return outcome


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return f"signal {signum}"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else ""
