"""What the search reads of a plan (``StageView`` per stage) and of a finished compile
(``Observation``: an OOM measures one device's worst tile; a success only says the split fits).

``OomInfo`` is what an out-of-memory compile told: it lives in the engine (``plan/``) because the
search learns from it; ``backends/`` builds it from compiler texts and ships it across the attempt
process boundary as plain JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sharderd.plan.types import Plan

__all__ = [
    "AttemptKey",
    "Observation",
    "OomInfo",
    "OomKind",
    "Runs",
    "Serialization",
    "StageView",
    "observe",
    "runs_minus",
    "runs_size",
    "runs_within",
    "stage_contents",
    "stage_views",
]

OomKind = Literal["tile", "variables", "code", "exchange", "stream"]


@dataclass(frozen=True, slots=True)
class OomInfo:
    """What an out-of-memory failure told us. Fields are None when the text has no number."""

    kind: OomKind
    """``tile``: "Out of memory on tile T: U bytes used..."; ``variables``: the numberless form;
    ``stream``: a host stream's buffer ("Single stream of length ..."), not the tiles' memory."""
    device: int | None = None
    tile: int | None = None
    """Global tile index as Poplar prints it."""
    bytes_used: int | None = None
    """Total bytes on that tile (not the excess)."""
    tile_bytes: int | None = None
    """Tile capacity as printed (638976 on Mk2)."""


Runs = tuple[tuple[int, int], ...]
"""A stage's nodes as sorted, disjoint ``[start, stop)`` runs of file indices."""
Serialization = tuple[tuple[str, int], ...]
"""MatMuls written with PopART's serialization: (node name, factor) (``plan.probe``)."""


@dataclass(frozen=True, slots=True)
class AttemptKey:
    """What makes two compiles the same: the split, the AMP and any matmul serialization (no split
    is compiled twice)."""

    digest: str
    amp: float
    stage_amps: tuple[float, ...] | None = None
    """Each stage's AMP when some stage has its own (``__available_memory``); None: all ``amp``."""
    serialize: Serialization = ()
    """MatMuls compiled with PopART's serialization, (node, factor) (``plan.probe``)."""

    def amp_on(self, device: int | None) -> float:
        """The AMP that device's conv/matmuls were compiled with (no device: the lowest)."""
        if self.stage_amps is None:
            return self.amp
        if device is None or not 0 <= device < len(self.stage_amps):
            return min(self.stage_amps)
        return self.stage_amps[device]

    @property
    def lowest(self) -> float:
        return min(self.stage_amps) if self.stage_amps else self.amp


@dataclass(frozen=True, slots=True)
class StageView:
    device: int
    predicted: float
    """Raw predicted memory / device capacity (before margin and correction)."""
    runs: Runs
    """The stage's nodes by file index."""
    code_share: float = 0.0
    """Code / predicted memory: a per-node constant no correction of bytes changes."""
    scale: float = 1.0
    """The factor the stage was planned with (corrected / predicted bytes, ``memory_scale``)."""

    @property
    def code(self) -> float:
        return self.predicted * self.code_share

    @property
    def rest(self) -> float:
        return self.predicted - self.code


def runs_size(runs: Runs) -> int:
    return sum(stop - start for start, stop in runs)


def runs_within(inner: Runs, outer: Runs) -> bool:
    """Every node of ``inner`` is in ``outer``."""
    i = j = both = 0
    while i < len(inner) and j < len(outer):
        lo, hi = max(inner[i][0], outer[j][0]), min(inner[i][1], outer[j][1])
        both += max(0, hi - lo)
        if inner[i][1] < outer[j][1]:
            i += 1
        else:
            j += 1
    return both == runs_size(inner)


def runs_minus(a: Runs, b: Runs) -> Runs:
    out: list[tuple[int, int]] = []
    for start, stop in a:
        cur = start
        for lo, hi in b:
            if hi <= cur or lo >= stop:
                continue
            if lo > cur:
                out.append((cur, lo))
            cur = max(cur, hi)
        if cur < stop:
            out.append((cur, stop))
    return tuple(out)


def stage_contents(assignment: np.ndarray, devices: int) -> tuple[Runs, ...]:
    out: list[list[tuple[int, int]]] = [[] for _ in range(devices)]
    if len(assignment):
        change = np.flatnonzero(np.diff(assignment)) + 1
        starts = np.concatenate(([0], change)).tolist()
        stops = np.concatenate((change, [len(assignment)])).tolist()
        for start, stop in zip(starts, stops, strict=True):
            out[int(assignment[start])].append((start, stop))
    return tuple(tuple(runs) for runs in out)


def stage_views(plan: Plan, capacity: int) -> tuple[StageView, ...]:
    contents = stage_contents(plan.assignment, plan.devices)
    views = []
    for k, stage in enumerate(plan.stages):
        memory = max(stage.memory_bytes, 1)
        scale = plan.memory_scale[k] if k < len(plan.memory_scale) else 1.0
        code = min(1.0, stage.code_bytes / memory)
        views.append(StageView(stage.index, memory / capacity, contents[k], code, scale))
    return tuple(views)


@dataclass(frozen=True, slots=True)
class Observation:
    attempt: int
    stage: StageView | None
    """None: the compiler named no device."""
    fits: bool
    measured: float | None
    """Worst tile / tile capacity when the compiler gave a number (> 1 on OOM)."""
    amp: float

    @property
    def device(self) -> int | None:
        return None if self.stage is None else self.stage.device


def observe(
    attempt: int,
    stages: Sequence[StageView],
    *,
    kind: Literal["ok", "oom"],
    amp: float,
    oom: OomInfo | None = None,
    tile_bytes: int = 0,
) -> tuple[Observation, ...]:
    """One observation per device on success (no bytes), the named device's on OOM."""
    if kind == "ok":
        return tuple(Observation(attempt, stage, True, None, amp) for stage in stages)
    assert oom is not None
    d = oom.device
    if d is None or not 0 <= d < len(stages):
        return (Observation(attempt, None, False, None, amp),)
    measured = None
    if oom.bytes_used is not None and (oom.tile_bytes or tile_bytes):
        measured = oom.bytes_used / (oom.tile_bytes or tile_bytes)
    return (Observation(attempt, stages[d], False, measured, amp),)
