"""Run the daemon's service (``sharderd.daemon.service.serve``) in the test's own event loop.

``serving(config)`` starts ``serve`` in a task group, returns once it is ready (``READY=1``) and
stops it on leaving the block, as SIGTERM would (``stop()`` sends it earlier; a second ``stop()``
is the second signal). Every structlog event the daemon logs lands in ``Served.lines`` (the same
dicts as the JSON lines: ``ts``, ``level``, ``event``, bound context), and every wait is "until this
condition holds or the deadline passes", woken by each new line: no fixed pauses. What only a real
process shows (exit codes, signals, kill -9, systemd's socket) stays with ``daemon_helpers``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from daemon_helpers import FAKE_POPRT, REPO

from sharderd.config import Config, load_config
from sharderd.daemon.service import serve
from sharderd.logs import EVENTS, CheckEvent

__all__ = ["Served", "serving"]


class Served:
    """The daemon running in this event loop, and what it has logged so far."""

    def __init__(self, config: Config, signals: anyio.abc.ObjectSendStream[signal.Signals]) -> None:
        self.config = config
        self.lines: list[dict[str, Any]] = []
        self.stopped = anyio.Event()
        self._signals = signals
        self._changed = anyio.Event()

    def record(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        try:
            anyio.get_current_task()
        except RuntimeError:  # logged from a worker thread: the waits' periodic check sees it
            return
        self._changed.set()

    def events(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            ln
            for ln in self.lines
            if ln.get("event") == event and all(ln.get(k) == v for k, v in fields.items())
        ]

    async def wait_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Until ``done()``, checked after each logged line (and every 0.05 s for file states)."""
        with anyio.move_on_after(timeout) as scope:
            while not done():
                if self.stopped.is_set():
                    raise AssertionError(
                        f"the daemon stopped while waiting for {what}\n{self.tail()}"
                    )
                self._changed = anyio.Event()
                with anyio.move_on_after(0.05):
                    await self._changed.wait()
        if scope.cancelled_caught:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{self.tail()}")

    async def wait_for(
        self, event: str, *, count: int = 1, timeout: float = 30.0, **fields: Any
    ) -> list[dict[str, Any]]:
        """Until ``count`` lines of ``event`` (with these field values) were logged in all."""
        await self.wait_until(
            lambda: len(self.events(event, **fields)) >= count,
            timeout,
            f"{count} × {event} {fields or ''}",
        )
        return self.events(event, **fields)

    async def wait_status(
        self, done: Callable[[dict[str, Any]], bool], what: str, timeout: float = 10.0
    ) -> dict[str, Any]:
        """Until the runtime folder's ``status.json`` satisfies ``done``."""
        path = _runtime(self.config) / "status.json"
        seen: list[dict[str, Any]] = []

        def check() -> bool:
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                return False
            seen[:] = [status]
            return bool(done(status))

        await self.wait_until(check, timeout, f"status.json: {what}")
        return seen[0]

    async def stop(self, timeout: float = 30.0) -> None:
        """What SIGTERM does (a second call: a second SIGTERM); returns once ``serve`` returned."""
        await self._signals.send(signal.SIGTERM)
        with anyio.fail_after(timeout):
            await self.stopped.wait()

    def tail(self, n: int = 25) -> str:
        return "last log lines:\n" + "\n".join(
            json.dumps(ln, default=str) for ln in self.lines[-n:]
        )

    def check_log(self) -> None:
        """Every line has ts, level and a registered event; every job line has a job_id."""
        for line in self.lines:
            assert {"ts", "level", "event"} <= line.keys(), line
            assert line["event"] in EVENTS, line
            if str(line["event"]).startswith(("job.", "plan.", "attempt.")):
                assert line.get("job_id"), line


def _runtime(config: Config) -> Path:
    runtime = config.daemon.runtime_dir
    assert runtime is not None, "the tests' configs set runtime_dir"
    return runtime


@contextlib.contextmanager
def _captured(served: list[Served]) -> Iterator[None]:
    """structlog's events into ``served[0].record``, rendered as the JSON lines would have them."""

    def collect(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        served[0].record(dict(event))
        raise structlog.DropEvent

    saved = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            CheckEvent(strict=True),
            structlog.processors.dict_tracebacks,  # an exception's text, as the JSON line has it
            collect,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**saved)


@contextlib.contextmanager
def _environment(env: Mapping[str, str], fake_poprt: bool) -> Iterator[None]:
    """``env`` for the daemon and its children; with ``fake_poprt``, ``poprt`` importable in both."""
    saved_env, saved_path = dict(os.environ), list(sys.path)
    paths = [str(FAKE_POPRT)] if fake_poprt else []
    os.environ.update(env)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*paths, *env.get("PYTHONPATH", "").split(os.pathsep), str(REPO)]
    ).strip(os.pathsep)
    sys.path[:0] = paths
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path


@contextlib.asynccontextmanager
async def serving(
    config: Path | Config, *, env: Mapping[str, str] | None = None, fake_poprt: bool = False
) -> AsyncIterator[Served]:
    """The daemon, ready; stopped (as by SIGTERM) when the block ends, its log checked if it
    ended without an error."""
    cfg = config if isinstance(config, Config) else load_config(config)
    send, receive = anyio.create_memory_object_stream[signal.Signals](2)
    served = Served(cfg, send)

    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            await serve(cfg, task_status=task_status, signals=receive)
        finally:
            served.stopped.set()

    with _environment(env or {}, fake_poprt), _captured([served]):
        async with send, receive, anyio.create_task_group() as tg:
            await tg.start(run)
            yield served
            if not served.stopped.is_set():
                await served.stop()
    served.check_log()
