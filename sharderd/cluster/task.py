"""The body of one attempt's Ray task, on whichever node Ray picked.

Inside: the same ``run_attempt`` → ``run_process`` path as a local attempt (own session, SIGTERM →
``kill_grace`` → SIGKILL, timeout, stderr tail), so a soft ``ray.cancel`` (a KeyboardInterrupt in
this worker) cancels it like any caller would and its whole process group is dead before the task
ends. Two details make the soft cancel land: SIGINT gets Python's handler back (a node started by
a non-interactive shell inherits SIGINT ignored) and a ticker wakes the event loop, which would
otherwise sleep in ``epoll`` past the interrupt. The attempt's group is recorded for the node's
sweeper while it runs. A produced artifact is sealed (fsync, rename) and digested here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import anyio

from sharderd.backends.attempt import run_attempt
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.cluster import artifacts, sweeper

__all__ = ["STARTED_NAME", "TICK_S", "execute"]

STARTED_NAME: Final = "started.json"
"""Written first thing into the attempt folder: the driver's proof that a node took the task."""
STDERR_NAME: Final = "stderr.log"
"""The attempt's stderr, appended as it arrives; the driver tails it into its log."""
STDERR_LIMIT: Final = 4 << 20
"""Bytes of stderr streamed at most (the tail still comes back with the outcome)."""
TICK_S: Final = 0.05


def execute(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Run the attempt ``payload`` describes; return the outcome and where it ran, as JSON data."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = Path(payload["workdir"])
    import ray  # only ever imported on a node, where it is running this

    node_id = ray.get_runtime_context().get_node_id()
    where = {"node_id": node_id, "host": socket.gethostname(), "pid": os.getpid()}
    (workdir / STARTED_NAME).write_text(_json(where), encoding="utf-8")
    sweep_dir = Path(payload["sweep_dir"])
    sweeper.ensure_sweeper(sweep_dir)
    request = AttemptRequest(**payload["request"])
    env = {**os.environ, **payload.get("env", {})}
    entries: list[Path] = []
    try:
        outcome = anyio.run(_run, request, workdir, payload, env, sweep_dir, entries)
    finally:
        for entry in entries:
            sweeper.unregister(entry)
    sealed: dict[str, Any] | None = None
    final = Path(payload["artifact_final"])
    written = Path(request.artifact)
    if outcome.outcome == "ok" and written.exists():
        d = artifacts.seal(written, final)
        sealed = {"path": str(final), "size": d.size, "sha256": d.sha256}
        outcome = dataclasses.replace(outcome, artifact=str(final))
    return {"outcome": outcome.to_json(), "where": where, "artifact": sealed}


async def _run(
    request: AttemptRequest,
    workdir: Path,
    payload: Mapping[str, Any],
    env: dict[str, str],
    sweep_dir: Path,
    entries: list[Path],
) -> AttemptOutcome:
    def started(pgid: int) -> None:
        entries.append(sweeper.register(sweep_dir, pgid, os.getpid()))

    streamed = 0

    def stream(chunk: bytes) -> None:
        nonlocal streamed
        if streamed < STDERR_LIMIT:
            os.write(log_fd, chunk[: STDERR_LIMIT - streamed])
            streamed += len(chunk)

    log_fd = os.open(
        workdir / STDERR_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
    )
    try:
        return await _run_with_ticker(request, workdir, payload, env, started, stream)
    finally:
        os.close(log_fd)


async def _run_with_ticker(
    request: AttemptRequest,
    workdir: Path,
    payload: Mapping[str, Any],
    env: dict[str, str],
    started: Callable[[int], None],
    stream: Callable[[bytes], None],
) -> AttemptOutcome:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_tick)
        outcome = await run_attempt(
            request,
            workdir,
            pool=AttemptPool(1),
            job_id=str(payload["job_id"]),
            timeout=float(payload["timeout"]),
            kill_grace=float(payload["kill_grace"]),
            env=env,
            argv_prefix=payload.get("argv_prefix"),
            on_started=started,
            on_stderr=stream,
        )
        tg.cancel_scope.cancel()
    return outcome


async def _tick() -> None:
    while True:
        await anyio.sleep(TICK_S)


def _json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)
