"""The host's IPUs as a counted resource: a benchmark holds the IPUs it runs on until it ends.

A compile needs CPUs only; running a PopEF attaches to IPUs, and the runtime throws when the IPUs
are attached already. So benchmarks take their IPUs from one host-wide count (``[poprt] ipus``)
and give them back when their run ends, fails or is cancelled: concurrent jobs never attach to the
same devices. Waiters are served first come, first served (a 4-IPU run is not overtaken for ever
by 1-IPU ones).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import final

import anyio
import anyio.lowlevel

__all__ = ["IpuPool"]


@dataclass(slots=True)
class _Waiter:
    count: int
    seq: int
    event: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False


@final
class IpuPool:
    """``total`` IPUs; ``hold(n)`` waits until ``n`` are free and keeps them for its body."""

    def __init__(self, total: int | None) -> None:
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        """None until an attempt has counted the host's IPUs (``[poprt] ipus = -1``)."""
        self._free = total or 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    @classmethod
    def of_setting(cls, ipus: int) -> IpuPool:
        """The pool for ``[poprt] ipus`` (-1: counted by the first compile attempt)."""
        return cls(ipus if ipus >= 0 else None)

    def learn(self, total: int) -> None:
        """Take the count an attempt read from ``DeviceManager().get_num_devices()``, once."""
        if self.total is None and total >= 0:
            self.total = total
            self._free += total

    @property
    def held(self) -> int:
        """IPUs held now."""
        return (self.total or 0) - self._free

    def can_hold(self, count: int) -> bool:
        """Whether ``count`` IPUs could ever be held here (not whether they are free now)."""
        return 0 < count <= (self.total or 0)

    @contextlib.asynccontextmanager
    async def hold(self, count: int) -> AsyncIterator[None]:
        """Hold ``count`` IPUs for the body; ``ValueError`` when the host has fewer in all."""
        if not self.can_hold(count):
            raise ValueError(f"{count} IPUs wanted, the host has {self.total}")
        await self._acquire(count)
        try:
            yield
        finally:
            self._release(count)

    async def _acquire(self, count: int) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not self._waiters and self._free >= count:
            self._free -= count
            return
        waiter = _Waiter(count, next(self._seq))
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self._release(count)  # granted just as we were cancelled: pass them on
            else:
                self._waiters.remove(waiter)
                self._grant()  # a big waiter leaving may unblock smaller ones behind it
            raise

    def _release(self, count: int) -> None:
        self._free += count
        self._grant()

    def _grant(self) -> None:
        """Hand free IPUs to waiters in arrival order, stopping at the first that does not fit."""
        while self._waiters and self._waiters[0].count <= self._free:
            waiter = self._waiters.pop(0)
            self._free -= waiter.count
            waiter.granted = True
            waiter.event.set()
