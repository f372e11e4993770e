"""Time stages on their own and as a pipeline whose stages run at the same time.

The pipeline gives each stage one thread, linked by bounded queues, as devices linked by
pipeline buffers would be: onnxruntime releases the GIL inside ``run``, so stages overlap and
the throughput shows the slowest stage, not the sum. This module measures; it orchestrates
nothing (the daemon's concurrency is anyio's).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PipelineTiming", "Step", "iqr", "time_calls", "time_pipeline"]

Step = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""One stage: takes every tensor known so far, returns them plus its outputs."""

_QUEUE_DEPTH = 2
"""Micro-batches in flight between two stages (double buffering)."""


@dataclass(frozen=True, slots=True)
class PipelineTiming:
    items: int
    """Micro-batches that went through every stage."""
    wall_s: float
    """From the first micro-batch entering stage 0 to the last leaving the final stage."""

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else 0.0


class _End:
    """Marks the end of the stream; ``error`` is set when a stage failed upstream."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def time_calls(call: Callable[[], object], *, warmup: int, runs: int) -> np.ndarray:
    """Seconds of each of ``runs`` calls (at least one) after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = np.empty(max(runs, 1))
    for k in range(len(times)):
        start = time.perf_counter()
        call()
        times[k] = time.perf_counter() - start
    return times


def iqr(times: np.ndarray) -> float:
    q1, q3 = np.percentile(times, [25, 75])
    return float(q3 - q1)


def time_pipeline(steps: Sequence[Step], feeds: Mapping[str, Any], *, items: int) -> PipelineTiming:
    """Push ``items`` copies of ``feeds`` through ``steps``, one thread per step.

    A step that raises stops the stream: it drains what is still coming (so upstream never blocks
    on a full queue), passes the error down, and it is re-raised here once every thread ended.
    """
    if not steps:
        raise ValueError("a pipeline needs at least one step")
    items = max(items, 1)
    links: list[queue.Queue[Any]] = [queue.Queue(maxsize=_QUEUE_DEPTH) for _ in steps]
    go = threading.Event()

    def source(step: Step, out: queue.Queue[Any]) -> None:
        go.wait()
        try:
            for _ in range(items):
                out.put(step(feeds))
        except BaseException as exc:  # handed to the caller, which re-raises it
            out.put(_End(exc))
            return
        out.put(_End())

    def relay(step: Step, inbox: queue.Queue[Any], out: queue.Queue[Any]) -> None:
        error: BaseException | None = None
        while True:
            item = inbox.get()
            if isinstance(item, _End):
                out.put(_End(error or item.error))
                return
            if error is not None:
                continue
            try:
                out.put(step(item))
            except BaseException as exc:  # drain the rest so upstream can finish
                error = exc

    threads = [threading.Thread(target=source, args=(steps[0], links[0]), daemon=True)]
    threads += [
        threading.Thread(target=relay, args=(step, links[k], links[k + 1]), daemon=True)
        for k, step in enumerate(steps[1:])
    ]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    go.set()
    done, error = 0, None
    while True:
        item = links[-1].get()
        if isinstance(item, _End):
            error = item.error
            break
        done += 1
    wall = time.perf_counter() - start
    for thread in threads:
        thread.join()
    if error is not None:
        raise error
    return PipelineTiming(items=done, wall_s=wall)
