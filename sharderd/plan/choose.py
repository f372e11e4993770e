"""Which compiled plan to keep: pure values, no I/O.

A pipeline exists for throughput: with several batches in flight its rate is set by its slowest
stage, while a lone batch's latency is the sum of all stages and their copies. Two splits can
rank differently on the two (a balanced split with big boundary tensors has the better rate and
the worse latency), so measured plans are ranked by measured throughput, never by latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Compiled", "best_compiled"]


@dataclass(frozen=True, slots=True)
class Compiled:
    """One attempt that compiled, as the choice sees it."""

    attempt: int
    predicted_s: float
    """The plan's predicted slowest stage (seconds per batch)."""
    throughput_per_s: float | None = None
    """Measured samples/s with batches in flight; None when not benchmarked. (A lone batch's
    latency is reported, never ranked, so the choice does not carry it.)"""


def best_compiled(compiled: Sequence[Compiled], *, by_measurement: bool) -> Compiled | None:
    """The highest measured throughput when measurements rank (``--optimal-perf``, measured cost
    model) and any attempt was measured; else the fastest predicted bottleneck. Ties keep the
    earlier attempt, so the choice is deterministic."""
    if not compiled:
        return None
    measured = [c for c in compiled if c.throughput_per_s]
    if by_measurement and measured:
        return max(measured, key=lambda c: (c.throughput_per_s or 0.0, -c.attempt))
    return min(compiled, key=lambda c: (c.predicted_s, c.attempt))
