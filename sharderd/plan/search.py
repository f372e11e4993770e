"""The proving search as pure functions over one frozen ``SearchState`` (``plan.search_state``).

``next_attempts`` says what to plan or start next (or the ``Verdict``), ``learn`` folds in one
event (a split planned or refused, a compile started or finished), ``verdict`` says how it ends.
Every decision the verdict rests on is made here: whether a planned split is worth a compile,
whether a probe's overflow is the proof, whether a compile's failure ends the search, when the
compiles are spent. ``job/prove.py`` is the loop around them, docs/search.md the rules.
"""

from __future__ import annotations

from dataclasses import replace

from sharderd.errors import PlanInfeasibleError
from sharderd.plan.amp_retry import amp_retry
from sharderd.plan.content import ContentCorrection
from sharderd.plan.memory_model import HEADROOM
from sharderd.plan.perf import perf_variants, worth_compiling
from sharderd.plan.probe import learned, serial_probe, why_no_proof
from sharderd.plan.search_state import (
    Attempt,
    Finished,
    Planned,
    SearchState,
    Started,
    Unplanned,
    Verdict,
)

__all__ = ["learn", "next_attempts", "verdict"]


def learn(state: SearchState, event: Planned | Started | Finished | Unplanned) -> SearchState:
    if isinstance(event, Planned):
        s = replace(state, asked=state.asked | {event.attempt})
        if worth_compiling(s, event.attempt, event.key, event.predicted_s):
            return replace(s, approved=event)
        return _unplanned(s, Unplanned(event.attempt))
    if isinstance(event, Started):
        return replace(
            state,
            attempts=(*state.attempts, event),
            asked=state.asked | {event.attempt},
            approved=None,
        )
    if isinstance(event, Unplanned):
        return _unplanned(replace(state, asked=state.asked | {event.attempt}), event)
    return _finished(state, event)


def _finished(state: SearchState, event: Finished) -> SearchState:
    done = replace(
        state.attempts[event.index],
        outcome=event.outcome,
        period_s=event.period_s,
        throughput=event.throughput,
        oom=event.oom,
    )
    attempts = tuple(done if a.index == event.index else a for a in state.attempts)
    s = replace(state, attempts=attempts, observations=(*state.observations, *event.observations))
    s = learned(state, s, done)
    if done.attempt.kind == "probe":  # evidence about memory, never a result
        doubt = why_no_proof(done, event, s.settings.lowest_amp)
        if doubt is None and s.proof is None:
            s = replace(s, proof=done.index)
        elif doubt:
            s = replace(s, doubts=(*s.doubts, doubt))
    elif event.outcome == "invalid" and s.failed is None:
        if event.cause == "verification":
            s = replace(s, failed=("verification", done.index))
        elif s.best() is None:
            s = replace(s, failed=("rejected", done.index))
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
            return replace(s, margin=1.0, ruled_out=True)  # let a compile decide, briefly
        if not s.overflows():
            return replace(s, settled=error)
        return replace(s, no_split=(len(s.overflows()), error))
    if kind == "verdict":
        assert s.no_split is not None
        return replace(s, settled=error or s.no_split[1])
    return s


def next_attempts(state: SearchState) -> tuple[Attempt | Planned, ...] | Verdict:
    """What to plan (an ``Attempt``) or start (the approved ``Planned``) next, best first (empty:
    wait for a running compile), or the verdict."""
    s, cfg = state, state.settings
    running = s.running()
    best = s.best()
    if s.error is not None or s.proof is not None or s.failed is not None:
        return verdict(s)
    if s.approved is not None:
        return (s.approved,)
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
    if len(s.attempts) < s.budget():
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
        retry, _ = amp_retry(s)
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


def verdict(state: SearchState) -> Verdict:
    """How the search ends now: the best compiled plan (with any probe proof it contradicts), a
    fatal error, the probe's proof, a failed compile, or not proven."""
    best = state.best()
    if best is not None:
        return Verdict(best.index, contradiction=state.proof)
    if state.error is not None:
        return Verdict(None, state.error)
    if state.proof is not None:
        return Verdict(None, proof=state.proof)
    if state.failed is not None:
        return Verdict(None, failed=state.failed)
    note = "".join(state.doubts) + amp_retry(state)[1]
    capped = state.ruled_out and len(state.attempts) >= state.budget()
    return Verdict(None, settled=state.settled, note=note, capped=capped)
