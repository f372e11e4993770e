"""The proving search as values: one frozen ``SearchState`` and pure functions.

``next_attempts`` says what to compile next (or the ``Verdict``), ``learn`` folds in one event,
``verdict`` says how it ends; ``job/prove.py`` is the loop around them, docs/search.md the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sharderd.errors import NoSplitError, PlanInfeasibleError, SharderdError
from sharderd.plan.content import ContentCorrection
from sharderd.plan.matmul_serial import Serialization, learned, serial_probe
from sharderd.plan.memory_model import (
    HEADROOM,
    UNKNOWN_OVER,
    amp_closing,
    content_model,
    overflow_need,
)
from sharderd.plan.observations import AttemptKey, Observation
from sharderd.plan.perf import PERF_BAND, perf_variants, worth_compiling
from sharderd.plan.stage_amp import cap_too_small, stage_retry, under_global

__all__ = [
    "PERF_BAND",
    "Attempt",
    "Finished",
    "SearchState",
    "Settings",
    "Started",
    "Unplanned",
    "Verdict",
    "best_compiled",
    "learn",
    "next_attempts",
    "verdict",
    "worth_compiling",
]

Kind = Literal["plan", "speculative", "roomy", "verdict", "probe", "amp", "perf", "calibrate"]


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
    amp_per_stage: bool = False  # an AMP retry lowers only the overflowed stage (plan.stage_amp)

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
    serialize: Serialization = ()  # MatMuls written with PopART's serialization (matmul_serial)


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


@dataclass(frozen=True, slots=True)
class Finished:
    """Event: a compile finished."""

    index: int
    outcome: str
    observations: tuple[Observation, ...] = ()
    period_s: float | None = None
    throughput: float | None = None
    node_times: tuple[tuple[str, float], ...] | None = None
    fatal: SharderdError | None = None


@dataclass(frozen=True, slots=True)
class Unplanned:
    """Event: the planner had no new split for ``attempt`` (``error`` None: only tried ones)."""

    attempt: Attempt
    error: NoSplitError | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    kept: int | None
    error: SharderdError | None = None
    """A fatal error or a proof (``PlanInfeasibleError``)."""
    settled: NoSplitError | None = None
    """The model as measured has no split: an estimate, never a proof."""
    note: str = ""
    """Why no lower AMP was tried, for the "not proven" message."""


@dataclass(frozen=True, slots=True)
class SearchState:
    settings: Settings
    margin: float
    observations: tuple[Observation, ...] = ()
    attempts: tuple[Started, ...] = ()
    asked: frozenset[Attempt] = frozenset()
    """Attempts already planned or refused by the planner: none is asked twice."""
    escalation: tuple[float, ...] = ()
    """Per-device factor grown by ``HEADROOM`` each time a re-plan reproduced a tried split."""
    escalations: int = 0
    """How many times: at most the compile budget, then the search stops re-planning."""
    no_split: tuple[int, NoSplitError] | None = None
    """The corrected model had no split at this many overflows: check the model as measured."""
    settled: NoSplitError | None = None
    error: SharderdError | None = None
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


def learn(state: SearchState, event: Started | Finished | Unplanned) -> SearchState:
    if isinstance(event, Started):
        return replace(
            state, attempts=(*state.attempts, event), asked=state.asked | {event.attempt}
        )
    if isinstance(event, Unplanned):
        return _unplanned(replace(state, asked=state.asked | {event.attempt}), event)
    done = replace(
        state.attempts[event.index],
        outcome=event.outcome,
        period_s=event.period_s,
        throughput=event.throughput,
    )
    attempts = tuple(done if a.index == event.index else a for a in state.attempts)
    s = replace(state, attempts=attempts, observations=(*state.observations, *event.observations))
    s = learned(state, s, done)
    if event.fatal is not None and s.error is None:
        s = replace(s, error=event.fatal)
    if event.node_times and s.settings.calibrate and s.measured_times is None:
        s = replace(s, measured_times=event.node_times)
    return s


def _unplanned(s: SearchState, event: Unplanned) -> SearchState:
    kind, error = event.attempt.kind, event.error
    if isinstance(error, PlanInfeasibleError):  # the weights alone: no compile can change it
        return replace(s, error=error)
    if kind == "plan" and error is None:  # reproduced a tried split: the last overflow needs more
        last = s.overflows()[-1].device if s.overflows() else None
        extra = list(s.escalation or (1.0,) * s.settings.devices)
        for d in range(len(extra)):
            if last is None or d == last:
                extra[d] *= HEADROOM
        return replace(s, escalation=tuple(extra), escalations=s.escalations + 1)
    if kind == "plan" and error is not None:
        if s.margin > 1.0 and not s.observations:  # an estimate with margin is no proof
            return replace(s, margin=1.0)  # let a compile decide
        if not s.overflows():
            return replace(s, settled=error)
        return replace(s, no_split=(len(s.overflows()), error))
    if kind == "verdict":
        assert s.no_split is not None
        return replace(s, settled=error or s.no_split[1])
    return s


def next_attempts(state: SearchState) -> tuple[Attempt, ...] | Verdict:
    """What to start next, best first (empty: wait for a running compile), or the verdict."""
    s, cfg = state, state.settings
    running = s.running()
    if s.error is not None:
        return verdict(s)
    best = s.best()
    calibrating = s.measured_times is not None and s.plan_attempt("calibrate") not in s.asked
    if best is not None and not cfg.optimal_perf and not calibrating:
        if any(
            r.attempt.kind == "calibrate"
            or (r.attempt.kind != "probe" and r.predicted_s < best.predicted_s)
            for r in running
        ):
            return ()  # a re-plan on measured times, or a plan predicted faster, may beat it
        return verdict(s)
    proposals: tuple[Attempt, ...] = ()
    if len(s.attempts) < cfg.max_attempts:
        proposals = tuple(a for a in _proposals(s, best) if a not in s.asked)
    if proposals or running:
        return proposals
    return verdict(s)


def _proposals(s: SearchState, best: Started | None) -> tuple[Attempt, ...]:
    cfg, running = s.settings, s.running()
    if best is not None:
        if s.measured_times is not None:
            return (s.plan_attempt("calibrate"),)
        return perf_variants(s, best) if cfg.optimal_perf else ()
    if (serial := serial_probe(s)) is not None:
        return (serial,)
    if s.settled is not None:
        if not s.attempts:
            return _probe(s)
        if any(a.attempt.kind == "amp" for a in running):
            return ()
        retry, _ = _amp_retry(s)
        return () if retry is None else (retry,)
    check = s.no_split is not None and s.no_split[0] == len(s.overflows())
    due = s.plan_attempt("verdict" if check else "plan")
    roomy = s.plan_attempt("roomy")
    if check and roomy not in s.asked and roomy.content.base > 1.0:
        due = roomy  # a split with room where no compile looked, if the measured model has one
    if due not in s.asked and (check or s.escalations < cfg.max_attempts):
        if s.attempts and running:
            return ()  # a running compile's outcome may change the re-plan: wait for it
        return (due,)
    if s.overflows():
        return ()
    spec = tuple(
        replace(s.plan_attempt(), kind="speculative", label=f"speculative margin {m:g}", margin=m)
        for m in cfg.speculative_margins
    )
    return (*_probe(s), *spec)


def _probe(s: SearchState) -> tuple[Attempt, ...]:
    """The probe (``plan.probe``), PopRT only, beside the first plan, at the lowest AMP."""
    if not s.settings.probe or s.observations or s.best() is not None:
        return ()
    lowest = s.settings.lowest_amp
    return (Attempt("probe", "probe", 1.0, (1.0,), ContentCorrection(), lowest),)


def _amp_retry(s: SearchState) -> tuple[Attempt | None, str]:
    """At most one lower AMP per level, on the overflowed split, and only when what the lower cap
    can take off the worst tile closes its gap; else why not (for the "not proven" message)."""
    cfg, settled = s.settings, s.settled
    if not cfg.fallbacks:
        return None, ""
    node = settled.node if settled is not None else None
    need = settled.node_need if settled is not None else 0.0
    if node is not None and amp_closing(need, cfg.default_amp, cfg.fallbacks) is None:
        return None, (
            f"; a lower available_memory_proportion was not tried: {node!r} alone "
            f"needs {need:.2f}× a device, and a cap on temporaries of "
            f"{min(cfg.fallbacks):g} instead of {cfg.default_amp:g} takes at most "
            f"{max(0.0, cfg.default_amp - min(cfg.fallbacks)) * 100:.0f}% of a tile off"
        )
    by_index = {a.index: a for a in s.attempts}
    ooms = [
        (o, by_index[o.attempt])
        for o in s.overflows()
        if o.attempt in by_index and by_index[o.attempt].attempt.kind != "probe"
    ]
    if not ooms:
        return None, ""
    if cfg.amp_per_stage and (staged := stage_retry(s, ooms)) is not None:
        return staged
    lowest = min(a.key.amp for _, a in ooms)
    o, base = min(
        ((o, a) for o, a in ooms if a.key.amp == lowest), key=lambda oa: overflow_need(oa[0])
    )
    need = overflow_need(o)
    amp = amp_closing(need, lowest, cfg.fallbacks)
    if o.stage is None:
        amp = max((a for a in cfg.fallbacks if a < lowest), default=None)
    if amp is None:
        where = f"attempt {base.index}"
        return None, cap_too_small(min(cfg.fallbacks), lowest, o.device, where, need)
    own = under_global(base.attempt.stage_amps, amp)
    if AttemptKey(base.key.digest, amp, own, base.key.serialize) in s.tried():
        return None, ""
    label = f"available_memory_proportion {amp:g}"
    retry = replace(base.attempt, kind="amp", label=label, amp=amp, of=base.index, stage_amps=own)
    return retry, ""


def verdict(state: SearchState) -> Verdict:
    """How the search ends now: the best compiled plan, a fatal error or proof, or not proven."""
    best = state.best()
    if best is not None:
        return Verdict(best.index)
    return Verdict(None, state.error, state.settled, _amp_retry(state)[1])
