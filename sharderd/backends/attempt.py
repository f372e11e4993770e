"""One compile attempt: request file in, a pool slot, a killable worker process, an outcome out.

The worker reports success or a compiler verdict (``ok``, ``oom``, ``invalid``) in
``result.json``; everything else (it hung, died, or left no readable result) is decided here from
the process's exit, so a broken worker is a ``crashed`` outcome with a reason, never an exception.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
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
    if runner is not None:
        async with pool.slot(job_id=job_id, priority=priority):
            return await runner(
                request,
                workdir,
                job_id=job_id,
                timeout=timeout,
                kill_grace=kill_grace,
                argv_prefix=argv_prefix,
            )
    request_path = workdir / REQUEST_NAME
    result_path = workdir / RESULT_NAME
    result_path.unlink(missing_ok=True)  # a stale result must never pass for this attempt's
    request.write(request_path)
    argv = [
        *(WORKER_ARGV if argv_prefix is None else argv_prefix),
        str(request_path),
        str(result_path),
    ]
    async with pool.slot(job_id=job_id, priority=priority):
        proc = await run_process(
            argv,
            cwd=workdir,
            env=env,
            timeout=timeout,
            kill_grace=kill_grace,
            on_started=on_started,
            on_stderr=on_stderr,
        )
    return outcome_of(proc, result_path, timeout=timeout)


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
