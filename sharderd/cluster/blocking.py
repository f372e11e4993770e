"""Blocking Ray calls off the event loop: each runs in its own daemon thread and is awaited.

Ray's driver API blocks: ``ray.nodes()``, ``ray.shutdown()`` and a first task submission wait for
the head (GCS) and, while it is gone, go on waiting until Ray's own reconnect timeout. On the event
loop that stops the daemon's heartbeat and its signal handling. Here the loop awaits an event the
thread sets when the call returns, so the wait can time out or be cancelled; the thread is then
left to finish (or not) on its own.

Not ``anyio.to_thread.run_sync``: its worker threads are not daemon threads, so one left stuck in
Ray keeps the interpreter from exiting, and its ``abandon_on_cancel`` needs a newer trio than the
one installed here (the daemon runs on asyncio, but this module does not depend on that).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["ThreadCall", "call"]

T = TypeVar("T")


class ThreadCall(Generic[T]):
    """``fn(*args, **kwargs)`` started now in a daemon thread; await :meth:`wait`, then :meth:`result`."""

    def __init__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> None:
        self._token = anyio.lowlevel.current_token()
        self._done = anyio.Event()
        self._outcome: tuple[bool, Any] | None = None
        name = f"sharderd {getattr(fn, '__qualname__', 'call')}"
        threading.Thread(target=self._run, args=(fn, args, kwargs), name=name, daemon=True).start()

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._outcome = (True, fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting task, which raises it
            self._outcome = (False, exc)
        with contextlib.suppress(Exception):  # the event loop may have ended meanwhile
            anyio.from_thread.run_sync(self._done.set, token=self._token)

    @property
    def finished(self) -> bool:
        return self._outcome is not None

    async def wait(self, timeout: float | None = None) -> bool:
        """Until the call returns (True) or ``timeout`` seconds pass (False); cancellable."""
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await self._done.wait()
        return self.finished

    def result(self) -> T:
        """What the call returned, or raise what it raised (only once it has finished)."""
        assert self._outcome is not None, "the call has not finished"
        ok, value = self._outcome
        if not ok:
            raise value
        return value


async def call(fn: Callable[..., T], *args: Any, within: float | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a daemon thread; ``TimeoutError`` when it has not returned
    ``within`` seconds (None: wait until it does; cancelling the wait leaves it to its thread)."""
    running = ThreadCall(fn, *args, **kwargs)
    if not await running.wait(within):
        raise TimeoutError(f"{getattr(fn, '__qualname__', fn)} did not return in {within:g} s")
    return running.result()
