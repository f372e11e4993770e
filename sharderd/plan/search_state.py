"""The proving search's values: its settings, the attempts it asks for, the events it learns from,
the verdict it ends with, and the frozen ``SearchState`` they fold into (``plan.search`` holds
the pure functions over them; docs/search.md the rules)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sharderd.errors import NoSplitError, SharderdError
from sharderd.plan.content import ContentCorrection
from sharderd.plan.memory_model import UNKNOWN_OVER, content_model
from sharderd.plan.observations import AttemptKey, Observation, OomKind, Serialization

__all__ = [
    "RULED_OUT",
    "Attempt",
    "Failure",
    "Finished",
    "Kind",
    "Planned",
    "SearchState",
    "Settings",
    "Started",
    "Unplanned",
    "Verdict",
    "best_compiled",
]

Kind = Literal["plan", "speculative", "roomy", "verdict", "probe", "amp", "perf", "calibrate"]
Failure = Literal["verification", "rejected"]
"""Why a compile ends the search without a result: the stages disagree with the model
(``verification``), or the backend rejected the sharded model before any plan compiled."""


RULED_OUT = 2
"""Compiles a job gets when the estimate with the safety margin had no split before any: the
split the estimate without the margin finds closest to fitting, then one more only where the
first's overflow leaves room for a fit (a re-plan or a verdict check the measured model allows, or
an AMP that can close the gap), the probe counted among them. The estimate is wrong by the margin
at most on the splits compiles confirm it on; one measurement, then one split that it allows, is
what a compile can decide, and a longer search there rarely ends in a fit (BENCHMARKS.md)."""


@dataclass(frozen=True, slots=True)
class Settings:
    devices: int
    margin: float
    default_amp: float
    fallbacks: tuple[float, ...] = ()
    """AMP levels a retry may use (PopRT only; empty for other backends)."""
    speculative_margins: tuple[float, ...] = ()
    max_attempts: int = 8
    optimal_perf: bool = False
    calibrate: bool = False
    """Re-plan once on the first compile's profiled node times (``cost_model = "measured"``)."""
    probe: bool = False
    """The backend can compile one node alone on one device (PopRT)."""
    amp_per_stage: bool = False  # an AMP retry lowers only the overflowed stage (plan.amp_retry)

    @property
    def lowest_amp(self) -> float:
        return min((self.default_amp, *self.fallbacks))


@dataclass(frozen=True, slots=True)
class Attempt:
    kind: Kind
    label: str
    margin: float
    scale: tuple[float, ...]
    content: ContentCorrection
    amp: float
    orders: tuple[str, ...] | None = None
    of: int | None = None
    """An AMP retry compiles this attempt's split again."""
    stage_amps: tuple[float, ...] | None = None  # each stage's AMP when some have their own
    serialize: Serialization = ()  # MatMuls written with PopART's serialization (plan.probe)


@dataclass(frozen=True, slots=True)
class Started:
    index: int
    attempt: Attempt
    key: AttemptKey
    predicted_s: float
    outcome: str | None = None
    """None while running; else the backend's outcome (ok, oom, invalid, crashed, timeout)."""
    period_s: float | None = None
    throughput: float | None = None
    serializable: tuple[str, int] | None = None  # a probe's MatMul: (name, factor) to retry with
    oom: OomKind | None = None
    """What ran out of memory, when the outcome is ``oom`` and the compiler said."""


@dataclass(frozen=True, slots=True)
class Planned:
    """Event: the planner's split for ``attempt``, before any file of it is written; the search
    decides whether it is worth a compile (``SearchState.approved``)."""

    attempt: Attempt
    key: AttemptKey
    predicted_s: float


@dataclass(frozen=True, slots=True)
class Finished:
    """Event: a compile finished."""

    index: int
    outcome: str
    observations: tuple[Observation, ...] = ()
    period_s: float | None = None
    throughput: float | None = None
    node_times: tuple[tuple[str, float], ...] | None = None
    oom: OomKind | None = None
    cause: str | None = None
    """Why an ``invalid`` outcome is invalid (``backends.protocol.Cause``)."""
    compiled_serialize: Serialization | None = None
    """The matmul serialization the compiled model itself carried, as the backend read it there
    (None: the backend did not say)."""


@dataclass(frozen=True, slots=True)
class Unplanned:
    """Event: the planner had no new split for ``attempt`` (``error`` None: only tried ones)."""

    attempt: Attempt
    error: NoSplitError | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    kept: int | None
    error: SharderdError | None = None
    """A fatal error or the planner's proof (``PlanInfeasibleError``)."""
    settled: NoSplitError | None = None
    """The model as measured has no split: an estimate, never a proof."""
    note: str = ""
    """What was not tried or proved nothing, and why, for the "not proven" message."""
    proof: int | None = None
    """The probe whose overflow proves that no split fits (exit 3, grounds ``probe``)."""
    failed: tuple[Failure, int] | None = None
    """The compile whose outcome ends the search without a result, and why."""
    contradiction: int | None = None
    """With ``kept``: a probe whose overflow would have been the proof; the compile wins."""
    capped: bool = False
    """The estimate ruled every split out before any compile, and its compiles are spent."""


@dataclass(frozen=True, slots=True)
class SearchState:
    settings: Settings
    margin: float
    observations: tuple[Observation, ...] = ()
    attempts: tuple[Started, ...] = ()
    asked: frozenset[Attempt] = frozenset()
    """Attempts already planned or refused by the planner: none is asked twice."""
    approved: Planned | None = None
    """A planned split worth its compile, to start next."""
    escalation: tuple[float, ...] = ()
    """Per-device factor grown by ``HEADROOM`` each time a re-plan reproduced a tried split."""
    escalations: int = 0
    """How many times: at most the compile budget, then the search stops re-planning."""
    no_split: tuple[int, NoSplitError] | None = None
    """The corrected model had no split at this many overflows: check the model as measured."""
    settled: NoSplitError | None = None
    error: SharderdError | None = None
    proof: int | None = None
    failed: tuple[Failure, int] | None = None
    ruled_out: bool = False
    """The estimate with the safety margin had no split before any compile (``RULED_OUT``)."""
    doubts: tuple[str, ...] = ()
    """Why an overflow that looked like a proof is none, for the "not proven" message."""
    measured_times: tuple[tuple[str, float], ...] | None = None
    serialized: Serialization = ()  # what every plan writes, once a serialized probe fit

    def overflows(self) -> tuple[Observation, ...]:
        return tuple(o for o in self.observations if not o.fits)

    def content(self, *, estimate: bool = False) -> ContentCorrection:
        """The per-node correction to plan with at the default AMP (``estimate``: as measured)."""
        return content_model(self.observations, amp=self.settings.default_amp, estimate=estimate)

    def scales(self) -> tuple[float, ...]:
        """Per-device factors on top of the content model: ``UNKNOWN_OVER`` for every overflow
        at the default AMP that named no device, times any escalation."""
        amp = self.settings.default_amp
        blind = sum(1 for o in self.overflows() if o.stage is None and o.amp == amp)
        extra = self.escalation or (1.0,) * self.settings.devices
        return tuple(UNKNOWN_OVER**blind * e for e in extra)

    def budget(self) -> int:
        """Compiles the search may start: ``--max-attempts``, or ``RULED_OUT`` when the estimate
        had no split before any compile and no compile has fitted since."""
        if self.ruled_out and self.best() is None:
            return min(RULED_OUT, self.settings.max_attempts)
        return self.settings.max_attempts

    def running(self) -> tuple[Started, ...]:
        return tuple(a for a in self.attempts if a.outcome is None)

    def tried(self) -> frozenset[AttemptKey]:
        """Every started key; a split that overflowed at a lower AMP overflows at the default too."""
        lower = {
            replace(a.key, amp=self.settings.default_amp, stage_amps=None)
            for a in self.attempts
            if a.outcome == "oom" and a.key.lowest < self.settings.default_amp
        }
        return frozenset({a.key for a in self.attempts} | lower)

    def best(self) -> Started | None:
        return best_compiled(
            [a for a in self.attempts if a.outcome == "ok" and a.attempt.kind != "probe"],
            by_measurement=self.settings.optimal_perf or self.measured_times is not None,
        )

    def plan_attempt(self, kind: Kind = "plan") -> Attempt:
        labels = {
            "roomy": "verdict check: the model as measured, unmeasured nodes as the least measured",
            "verdict": "verdict check: the model as measured, no margin",
            "calibrate": "re-plan on measured times",
        }
        label = labels.get(kind, "plan" if not self.overflows() else "re-plan after OOM")
        estimate = kind in ("roomy", "verdict")
        content = self.content(estimate=estimate)
        if kind == "roomy":  # every factor at least the estimate's: a split it allows
            exact = content_model(self.observations, amp=self.settings.default_amp, exact=True)
            least = min((f for _, f in exact.patches), default=1.0)
            content = replace(exact, base=max(1.0, least), fixed_on_heaviest=True)
        return Attempt(
            kind,
            label,
            1.0 if estimate else self.margin,
            self.scales(),
            content,
            self.settings.default_amp,
            serialize=self.serialized,
        )


def best_compiled(compiled: Sequence[Started], *, by_measurement: bool) -> Started | None:
    """The compiled plan to keep: the highest measured throughput when measurements rank
    (``--optimal-perf``, measured cost model) and any was measured, never the latency of a lone
    batch (a balanced split with big boundary tensors can have the better rate and the worse
    latency); else the fastest predicted bottleneck. Ties keep the earlier attempt."""
    measured = [c for c in compiled if c.throughput]
    if by_measurement and measured:
        return max(measured, key=lambda c: (c.throughput or 0.0, -c.index))
    return min(compiled, key=lambda c: (c.predicted_s, c.index), default=None)
