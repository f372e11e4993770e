"""The search on recorded observation sequences: the memory model, and what ``next_attempts``,
``learn`` and ``verdict`` make of a sequence of events (pure values, no compiles)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sharderd.errors import NoSplitError, PlanInfeasibleError
from sharderd.plan.content import node_factors
from sharderd.plan.memory_model import HEADROOM, NOISE, amp_closing, content_model, stage_factor
from sharderd.plan.observations import AttemptKey, Observation, OomInfo, StageView, observe
from sharderd.plan.perf import worth_compiling
from sharderd.plan.search import learn, next_attempts, verdict
from sharderd.plan.search_state import (
    Attempt,
    Finished,
    Planned,
    SearchState,
    Settings,
    Started,
    Unplanned,
    Verdict,
)

TILE = 638_976
N = 700


def stage(
    device: int, predicted: float, start: int = 0, stop: int = 100, code: float = 0.0
) -> StageView:
    return StageView(device, predicted, ((start, stop),), code_share=code)


def oom(attempt: int, st: StageView, measured: float, amp: float = 0.6) -> Observation:
    return Observation(attempt, st, False, measured, amp)


def factors(obs: list[Observation], *, estimate: bool = False) -> np.ndarray:
    return node_factors(content_model(obs, amp=0.6, estimate=estimate), N)


def test_evidence_follows_the_nodes_not_the_device_index() -> None:
    """The issue's sequence: device 0's observation (ratio 1.657) stays on the nodes it held; other
    devices running out of memory with other ratios neither raise it nor reach other nodes."""
    first = factors([oom(0, stage(0, 0.6), 0.6 * 1.657)])
    assert np.allclose(first[:100], 1.657 * HEADROOM) and (first[100:] == 1.0).all()
    obs = [
        oom(0, stage(0, 0.6), 0.6 * 1.657),
        oom(1, stage(3, 0.6, 300, 400), 0.6 * 2.1),
        oom(2, stage(5, 0.6, 500, 600), 0.6 * 1.3),
    ]
    later = factors(obs)
    assert np.allclose(later[:100], first[:100])
    assert (later[100:300] == 1.0).all() and (later[600:] == 1.0).all()
    moved = factors([oom(0, stage(4, 0.6), 0.6 * 1.657)])  # the same layers on device 4
    assert np.array_equal(moved, first)


def test_noise_never_makes_a_hopeless_factor() -> None:
    """0.80 → 0.70 with 1.10 → 1.09 and 0.80 → 0.75 with 1.10 → 1.08 (the issue's pairs): each
    stage keeps its own ratio, never 1e6 or 4.08."""
    for (p1, m1), (p2, m2) in (((0.80, 1.10), (0.70, 1.09)), ((0.80, 1.10), (0.75, 1.08))):
        obs = [oom(0, stage(0, p1, 0, 80), m1), oom(1, stage(0, p2, 0, 70), m2)]
        f = factors(obs)
        assert f.max() < 1.7
        assert abs(f[75] - m1 / p1 * HEADROOM) < 1e-9  # only the first stage held node 75


def test_code_is_not_scaled() -> None:
    """Half the stage is code (a per-node constant): the factor on the rest reproduces the bytes."""
    o = oom(0, stage(0, 0.8, code=0.5), 1.2)
    f = stage_factor(o, 1.2)
    assert abs(0.4 + 0.4 * f - 1.2) < 1e-12
    assert stage_factor(oom(0, stage(0, 0.8, code=1.0), 1.2), 1.2) >= 1e6  # nothing holds it


def test_estimate_reproduces_every_oom_even_within_the_noise() -> None:
    """Every overflowing stage stays over capacity in the verdict's model, so the very stage that
    ran out of memory is not predicted to fit and compiled again; the noise is given only to
    stages holding fewer of its nodes (here one 2% over: the stage itself stays over, 95% of it
    may fit)."""
    obs = [
        oom(0, stage(0, 0.7, 0, 100, code=0.2), 1.10),
        oom(1, stage(1, 0.6, 50, 180, code=0.3), 1.20),
        oom(2, stage(2, 0.5, 300, 400), 1.02),
    ]
    f = factors(obs, estimate=True)
    for o in obs:
        assert o.stage is not None and o.measured is not None
        ((a, b),) = o.stage.runs
        code = o.stage.predicted * o.stage.code_share
        corrected = code + (o.stage.predicted - code) * f[a:b].min()
        assert corrected >= o.measured * (1 - NOISE) - 1e-12
        assert corrected > 1.0
    near = obs[2].stage
    assert near is not None
    smaller = near.predicted * 0.95 * f[near.runs[0][0] : near.runs[0][1]].min()
    assert smaller < 1.0


def test_a_lower_cap_takes_off_at_most_what_was_above_it() -> None:
    """PopART's AMP is a per-tile cap on conv/matmul temporaries: lowering it from 0.6 to 0.3 can
    take at most 0.3 of a tile off, however large the tile's activations; not the fake's linear
    a/amp shrink, which would promise more where temporaries dominate."""
    assert amp_closing(1.25, 0.6, (0.3, 0.1)) == 0.3
    assert amp_closing(1.4, 0.6, (0.3, 0.1)) == 0.1
    assert amp_closing(1.6, 0.6, (0.3, 0.1)) is None
    assert amp_closing(1.05, 0.6, ()) is None


def test_a_fixed_cost_is_charged_to_the_nodes_that_keep_it() -> None:
    """A stage shrunk around one op's fixed cost (a Gather's code) still overflows almost as much:
    the nodes it gave up cost only the difference, and the rest of what the smaller stage measures
    is a fixed cost that goes with its nodes (one weight they all read), not a rate on its bytes."""
    outer, inner = oom(0, stage(0, 0.8, 0, 100), 1.5), oom(1, stage(1, 0.4, 0, 50), 1.3)
    model = content_model([outer, inner], amp=0.6)
    rate = (1.5 - 1.3) * HEADROOM / 0.4  # 0.525 per predicted byte
    f = node_factors(model, N)
    assert abs(f[75] - rate) < 1e-9  # the nodes given up are cheap
    assert f[25] == 1.0  # the kept ones are not condemned (the prior stands)
    ((nodes, share),) = model.fixed
    assert nodes == ((0, 50),) and abs(share - (1.3 * HEADROOM - rate * 0.4)) < 1e-9
    assert abs(rate * 0.4 + rate * 0.4 + share - 1.5 * HEADROOM) < 1e-9  # outer reproduced
    assert content_model([inner, outer], amp=0.6) == model  # either order, one model
    verdict = content_model([outer, inner], amp=0.6, estimate=True)
    assert verdict.fixed_on_heaviest and not model.fixed_on_heaviest


SETTINGS = Settings(
    devices=2,
    margin=1.15,
    default_amp=0.6,
    fallbacks=(0.3, 0.1),
    speculative_margins=(1.3,),
    max_attempts=8,
    probe=True,
)
PLAN = (stage(0, 0.7, 0, 100), stage(1, 0.5, 100, 200))


def first(state: SearchState) -> Attempt:
    wanted = next_attempts(state)
    assert isinstance(wanted, tuple) and wanted, wanted
    return wanted[0]


def start(
    state: SearchState, attempt: Attempt, digest: str, predicted_s: float = 1.0
) -> SearchState:
    index = len(state.attempts)
    key = AttemptKey(digest, attempt.amp)
    event = Started(index, attempt, key, predicted_s)
    return learn(state, event)


def overflow(index: int, device: int, measured: float, amp: float = 0.6) -> Finished:
    info = OomInfo("tile", device, 3, int(measured * TILE), TILE)
    return Finished(index, "oom", observe(index, PLAN, kind="oom", amp=amp, oom=info))


def test_the_first_plan_then_the_probe_and_a_speculative_margin_beside_it() -> None:
    state = SearchState(SETTINGS, 1.15)
    plan = first(state)
    assert (plan.kind, plan.label, plan.margin, plan.amp) == ("plan", "plan", 1.15, 0.6)
    assert plan.content.identity
    state = start(state, plan, "a")
    wanted = next_attempts(state)
    assert isinstance(wanted, tuple)
    assert [(a.kind, a.amp) for a in wanted] == [("probe", 0.1), ("speculative", 0.6)]
    assert wanted[1].margin == 1.3
    no_probe = SearchState(replace(SETTINGS, probe=False), 1.15)
    assert [a.kind for a in next_attempts(start(no_probe, plan, "a"))] == ["speculative"]  # type: ignore[union-attr]


def test_a_re_plan_waits_for_the_running_compile_and_carries_every_overflow() -> None:
    state = SearchState(SETTINGS, 1.15)
    state = start(state, first(state), "a")
    spec = next_attempts(state)[1]  # type: ignore[index]
    state = start(state, spec, "b")
    state = learn(state, overflow(0, 0, 1.3))
    assert next_attempts(state) == ()  # the speculative compile is still running
    state = learn(state, overflow(1, 1, 1.2))
    replan = first(state)
    assert replan.kind == "plan" and replan.label == "re-plan after OOM"
    f = node_factors(replan.content, N)
    assert abs(f[50] - 1.3 / 0.7 * HEADROOM) < 1e-5 and abs(f[150] - 1.2 / 0.5 * HEADROOM) < 1e-5
    assert (f[200:] == 1.0).all()


def test_a_fit_ends_the_search_unless_a_faster_plan_is_still_running() -> None:
    state = SearchState(SETTINGS, 1.15)
    state = start(state, first(state), "a", predicted_s=2.0)
    spec = next_attempts(state)[1]  # type: ignore[index]
    state = start(state, spec, "b", predicted_s=1.0)
    done = learn(state, Finished(0, "ok", observe(0, PLAN, kind="ok", amp=0.6)))
    assert next_attempts(done) == ()  # attempt 1 predicts faster: wait for it
    assert next_attempts(learn(done, overflow(1, 0, 1.1))) == Verdict(0)
    assert next_attempts(learn(done, Finished(1, "ok"))) == Verdict(1)


def test_no_split_under_the_corrections_checks_the_model_as_measured_then_amp_then_not_proven() -> (
    None
):
    state = SearchState(SETTINGS, 1.15)
    plan = first(state)
    state = learn(start(state, plan, "a"), overflow(0, 0, 1.2))
    state = learn(state, Unplanned(first(state)))  # the probe and the margin: no split either
    state = learn(state, Unplanned(first(state)))
    replan = first(state)
    err = NoSplitError("no split under the corrections")
    state = learn(state, Unplanned(replan, err))
    roomy = first(state)  # first a split with the unmeasured nodes at the least measured factor
    assert roomy.kind == "roomy" and roomy.margin == 1.0
    f = node_factors(roomy.content, N)
    assert abs(f[50] - 1.2 / 0.7) < 1e-5 and abs(f[400] - 1.2 / 0.7) < 1e-5
    assert (f >= node_factors(content_model(state.observations, amp=0.6, estimate=True), N)).all()
    state = learn(state, Unplanned(roomy))
    check = first(state)
    assert check.kind == "verdict" and check.margin == 1.0 and check.content.fixed_on_heaviest
    settled = learn(state, Unplanned(check))  # only the tried split: settled, with the base error
    retry = first(settled)
    assert (retry.kind, retry.amp, retry.of) == ("amp", 0.3, 0)  # 0.3 off a tile closes 1.2
    far = learn(start(SearchState(SETTINGS, 1.15), plan, "a"), overflow(0, 0, 1.6))
    far = replace(far, settled=err)
    end = next_attempts(far)
    assert isinstance(end, Verdict) and end.kept is None and end.settled is err
    assert "available_memory_proportion was not tried" in end.note and "60% over" in end.note
    assert isinstance(err, NoSplitError) and end.error is None  # not proven, never a proof


def test_an_estimate_with_margin_lets_a_compile_decide_without_it() -> None:
    """Before any compile, "no split" under the margin is an estimate: the next plan drops the
    margin (the planner then offers its least overfull split); without a margin it settles."""
    state = SearchState(SETTINGS, 1.15)
    state = learn(state, Unplanned(first(state), NoSplitError("margin")))
    assert state.margin == 1.0 and state.settled is None and first(state).margin == 1.0
    hopeless = learn(state, Unplanned(first(state), NoSplitError("no")))
    assert hopeless.settled is not None and first(hopeless).kind == "probe"


def test_a_proof_ends_the_search_as_itself() -> None:
    proof = PlanInfeasibleError("weights", grounds="weights_total")
    state = SearchState(SETTINGS, 1.15)
    ended = learn(state, Unplanned(first(state), proof))
    assert next_attempts(ended) == Verdict(None, proof, None, "")
    probe = Attempt("probe", "probe", 1.0, (1.0,), first(state).content, 0.1)
    running = start(start(state, first(state), "a"), probe, "p")
    proven = learn(running, Finished(1, "oom", oom="tile"))
    assert verdict(proven) == Verdict(None, proof=1) and next_attempts(proven) == Verdict(
        None, proof=1
    )


def test_a_re_plan_that_reproduces_a_tried_split_grows_the_last_overflow_within_the_budget() -> (
    None
):
    small = replace(SETTINGS, max_attempts=2, speculative_margins=(), probe=False)
    state = learn(
        start(SearchState(small, 1.15), first(SearchState(small, 1.15)), "a"), overflow(0, 1, 1.1)
    )
    for k in range(2):
        state = learn(state, Unplanned(first(state)))
        assert state.scales() == (1.0, HEADROOM ** (k + 1))
    end = next_attempts(state)  # the budget of re-plans is spent: not proven, not a proof
    assert isinstance(end, Verdict) and end.kept is None and end.error is None


def test_a_split_that_overflowed_at_a_lower_amp_is_not_compiled_at_the_default() -> None:
    state = SearchState(SETTINGS, 1.15)
    plan = first(state)
    state = learn(start(state, replace(plan, amp=0.3), "abc"), overflow(0, 0, 1.02, amp=0.3))
    assert not worth_compiling(state, plan, AttemptKey("abc", 0.6), 1.0)
    assert worth_compiling(state, plan, AttemptKey("other", 0.6), 1.0)
    assert state.content().identity  # its bytes are evidence at 0.3 only


def test_a_re_plan_on_measured_times_is_waited_for() -> None:
    """With ``cost_model = "measured"`` the first fit's profile asks for one re-plan on measured
    times; the search waits for it even when its prediction (in other units) is slower."""
    cfg = replace(SETTINGS, calibrate=True, probe=False, speculative_margins=())
    state = SearchState(cfg, 1.15)
    state = start(state, first(state), "a", predicted_s=1.0)
    state = learn(state, Finished(0, "ok", node_times=(("n", 0.5),)))
    again = first(state)
    assert again.kind == "calibrate" and state.measured_times == (("n", 0.5),)
    state = start(state, again, "b", predicted_s=5.0)
    assert next_attempts(state) == ()
    assert next_attempts(learn(state, Finished(1, "ok"))) == Verdict(0)


def _with_probe(settings: Settings = SETTINGS) -> SearchState:
    """The first plan (attempt 0) and the probe (attempt 1, at the lowest AMP) running."""
    state = SearchState(settings, 1.15)
    state = start(state, first(state), "a", predicted_s=1.0)
    probe = next_attempts(state)[0]  # type: ignore[index]
    assert probe.kind == "probe"
    return learn(state, Started(1, probe, AttemptKey("probe:n", probe.amp), 0.0))


def test_a_probe_out_of_host_stream_memory_proves_nothing() -> None:
    """The probe feeds its node's inputs from the host, as no split does: a host-stream overflow
    there is the probe's own, no proof; a tile overflow is the proof."""
    stream = learn(_with_probe(), Finished(1, "oom", oom="stream"))
    assert stream.proof is None and not isinstance(next_attempts(stream), Verdict)
    assert stream.doubts == (
        "; the probe (attempt 1) ran out of host-stream memory, and it feeds the node's inputs "
        "from the host as no split does, so that proves nothing",
    )
    tile = learn(_with_probe(), Finished(1, "oom", oom="tile"))
    assert tile.proof == 1 and next_attempts(tile) == Verdict(None, proof=1)


def test_a_compile_that_fits_wins_over_a_probe_proof_and_says_so() -> None:
    """The plan fitted, then the probe overflowed (or the other way round, both outcomes in
    before the verdict): the compile wins, and the verdict names the probe it contradicts."""
    fitted = Finished(0, "ok", observe(0, PLAN, kind="ok", amp=0.6))
    for events in (
        (fitted, Finished(1, "oom", oom="tile")),
        (Finished(1, "oom", oom="tile"), fitted),
    ):
        state = _with_probe()
        for event in events:
            state = learn(state, event)
        assert next_attempts(state) == Verdict(0, contradiction=1)
    alone = learn(_with_probe(), fitted)
    assert next_attempts(alone) == Verdict(0)


def test_an_estimate_that_ruled_every_split_out_gets_two_compiles() -> None:
    """No split at the margin before any compile: the split closest to fitting is compiled
    (margin 1), then, after its overflow, one re-plan the measurement allows; then exit 5, the
    verdict saying the compiles were capped (here the probe is off)."""
    cfg = replace(SETTINGS, probe=False, speculative_margins=())
    state = SearchState(cfg, 1.15)
    state = learn(state, Unplanned(first(state), NoSplitError("margin")))
    assert state.ruled_out and state.margin == 1.0
    state = learn(start(state, first(state), "a"), overflow(0, 0, 1.2))
    replan = first(state)
    assert replan.kind == "plan" and not replan.content.identity
    second = start(state, replan, "b")
    end = next_attempts(learn(second, overflow(1, 1, 1.1)))
    assert isinstance(end, Verdict) and end.kept is None and end.capped and end.error is None
    assert next_attempts(learn(second, Finished(1, "ok"))) == Verdict(1)  # a fit is kept


def test_the_probe_counts_among_the_two_compiles() -> None:
    state = SearchState(replace(SETTINGS, speculative_margins=()), 1.15)
    state = learn(state, Unplanned(first(state), NoSplitError("margin")))
    state = start(state, first(state), "a")
    probe = first(state)
    assert probe.kind == "probe"
    state = learn(state, Started(1, probe, AttemptKey("probe:n", 0.1), 0.0))
    state = learn(learn(state, Finished(1, "ok")), overflow(0, 0, 1.2))
    end = next_attempts(state)
    assert isinstance(end, Verdict) and end.capped and end.proof is None


def test_an_optimal_perf_variant_is_compiled_only_when_its_calibrated_prediction_wins_the_band() -> (
    None
):
    """The best compile measured 2.0 s per batch for a 1.0 s prediction (ratio 2): a variant
    predicted at 0.5 s is calibrated to 1.0 s, and compiled only if 1.0 × PERF_BAND beats 2.0,
    i.e. a prediction under 2.0 / (2 × 0.9) = 1.111 s; a plan of any other kind always is."""
    cfg = replace(SETTINGS, optimal_perf=True, probe=False, speculative_margins=())
    state = start(SearchState(cfg, 1.15), first(SearchState(cfg, 1.15)), "a", predicted_s=1.0)
    state = learn(state, Finished(0, "ok", period_s=2.0, throughput=1.0))
    variant = replace(first(state), kind="perf")
    edge = 2.0 / (2.0 * 0.9)
    assert worth_compiling(state, variant, AttemptKey("b", 0.6), edge * 0.999)
    assert not worth_compiling(state, variant, AttemptKey("b", 0.6), edge * 1.001)
    assert not worth_compiling(state, variant, AttemptKey("a", 0.6), 0.1)  # compiled already
    plan = replace(variant, kind="plan")
    assert worth_compiling(state, plan, AttemptKey("b", 0.6), 100.0)
    unmeasured = learn(
        start(SearchState(cfg, 1.15), first(SearchState(cfg, 1.15)), "a"), Finished(0, "ok")
    )
    assert not worth_compiling(unmeasured, variant, AttemptKey("b", 0.6), 0.1)


# --- nested overflows at their edges (memory_model._nested) ------------------------------------


def _nested(outer: Observation, inner: Observation, **kw: bool) -> tuple[tuple, ...]:
    """The ``measured`` (priced between) entries of the model the two overflows imply."""
    return content_model([outer, inner], amp=0.6, **kw).measured


def test_nested_overflows_compiled_smaller_first_imply_the_same_model() -> None:
    """The inner stage compiled first and the outer later (attempt order is the fold's order)."""
    inner, outer = oom(0, stage(1, 0.4, 0, 50), 1.3), oom(1, stage(0, 0.8, 0, 100), 1.5)
    model = content_model([inner, outer], amp=0.6)
    ((between, rate),) = model.measured
    assert between == ((50, 100),) and abs(rate - 0.2 * HEADROOM / 0.4) < 1e-9
    assert [runs for runs, _ in model.patches] == [((0, 50),)] and model.fixed


def test_stages_predicted_within_the_noise_are_one_reading_and_just_outside_two() -> None:
    """Predicted shares exactly ``NOISE`` apart are two readings (nested: the nodes between are
    priced); a hair closer, one reading (each stage keeps its own factor, none between)."""
    low = 0.2
    assert (low + NOISE) - low == NOISE  # exactly the noise apart in floating point
    inner = oom(1, stage(1, low, 0, 90), 1.1)
    assert _nested(oom(0, stage(0, low + NOISE, 0, 100), 1.3), inner)
    assert not _nested(oom(0, stage(0, low + NOISE * 0.999, 0, 100), 1.3), inner)
    closer = factors([oom(0, stage(0, low + NOISE * 0.999, 0, 100), 1.3), inner])
    assert abs(closer[95] - 1.3 / (low + NOISE * 0.999) * HEADROOM) < 1e-9


def test_readings_within_the_noise_are_one_reading_and_just_outside_two() -> None:
    """Measured worst tiles just under ``NOISE`` apart say nothing about the nodes between; just
    over, they price them. (Exactly ``NOISE`` apart cannot happen for two overflows: both are over
    1, where doubles differ by multiples of 2**-52, which 0.03 is not.)"""
    inner = oom(1, stage(1, 0.4, 0, 50), 1.2)
    assert not _nested(oom(0, stage(0, 0.8, 0, 100), 1.2 + NOISE * 0.999), inner)
    assert _nested(oom(0, stage(0, 0.8, 0, 100), 1.2 + NOISE * 1.001), inner)


def test_the_nodes_between_nested_stages_are_priced_net_of_their_code() -> None:
    """Code is not scaled: the rate between is the readings' difference less the code the outer
    stage holds beyond the inner's, over the rest of the bytes between."""
    outer, inner = (
        oom(0, stage(0, 1.0, 0, 100, code=0.3), 1.6),
        oom(1, stage(1, 0.5, 0, 50, code=0.2), 1.2),
    )
    ((_, rate),) = _nested(outer, inner, exact=True)
    assert abs(rate - ((1.6 - 1.2) - (0.3 - 0.1)) / (0.7 - 0.4)) < 1e-12


def test_a_larger_stage_that_measured_no_more_prices_nothing_between() -> None:
    """The outer stage's reading, net of its extra code, is no more than the inner's: no rate (a
    rate of 0 or less would make the nodes between free); each stage keeps its own factor."""
    outer, inner = oom(0, stage(0, 1.0, 0, 100), 1.1), oom(1, stage(1, 0.5, 0, 50), 1.3)
    assert not _nested(outer, inner)
    f = factors([outer, inner])
    assert abs(f[75] - 1.1 * HEADROOM) < 1e-9 and abs(f[25] - 1.3 / 0.5 * HEADROOM) < 1e-9
    # exactly nothing net of code (1.5 - 1.25 == 1.0 * 0.5 - 0.5 * 0.5, every number exact)
    even = (
        oom(0, stage(0, 1.0, 0, 100, code=0.5), 1.5),
        oom(1, stage(1, 0.5, 0, 50, code=0.5), 1.25),
    )
    assert not _nested(*even, exact=True)


def test_an_overflow_without_a_number_is_never_nested() -> None:
    """A device named without bytes has no reading to difference: it stands alone."""
    outer, inner = (
        Observation(0, stage(0, 0.8), False, None, 0.6),
        oom(1, stage(1, 0.4, 0, 50), 1.3),
    )
    assert not _nested(outer, inner) and not _nested(inner, outer)
    assert content_model([outer, inner], amp=0.6).patches


def test_the_same_nodes_overflowing_twice_price_nothing_between() -> None:
    """One stage's nodes compiled twice (planned at other factors, so other predictions) leave no
    nodes between: both readings patch those nodes, no rate or fixed cost is made up."""
    first, again = oom(0, stage(0, 0.8, 0, 100), 1.5), oom(1, stage(1, 0.6, 0, 100), 1.3)
    model = content_model([first, again], amp=0.6)
    assert not model.measured and not model.fixed and len(model.patches) == 2


def test_only_the_plan_itself_finding_no_split_settles_or_drops_the_margin() -> None:
    """A speculative margin, a probe or the roomy check finding no split says nothing of the plan
    at the search's margin: the margin stays, nothing is ruled out or settled."""
    state = SearchState(SETTINGS, 1.15)
    state = start(state, first(state), "a")
    spec = next_attempts(state)[1]  # type: ignore[index]
    assert spec.kind == "speculative"
    after = learn(state, Unplanned(spec, NoSplitError("none at margin 1.3")))
    assert (after.margin, after.ruled_out, after.settled, after.no_split) == (
        1.15,
        False,
        None,
        None,
    )
    assert spec in after.asked


# --- learn: each event's effect on the state ------------------------------------------------------


def test_a_planned_split_is_approved_once_and_started_next_a_tried_one_re_plans() -> None:
    """``Planned``: asked, and approved when worth a compile (``next_attempts`` offers it alone
    until it starts, which clears it); a split already compiled is refused like an unplanned one
    (the last overflow grows), never approved."""
    state = SearchState(SETTINGS, 1.15)
    plan = first(state)
    planned = Planned(plan, AttemptKey("a", 0.6), 2.0)
    approved = learn(state, planned)
    assert approved.approved == planned and plan in approved.asked
    assert next_attempts(approved) == (planned,)
    running = learn(approved, Started(0, plan, planned.key, 2.0))
    assert running.approved is None and running.attempts[0].predicted_s == 2.0
    state = learn(running, overflow(0, 1, 1.1))
    replan = first(state)
    again = learn(state, Planned(replan, AttemptKey("a", 0.6), 2.0))  # the same split again
    assert again.approved is None and replan in again.asked
    assert again.escalations == 1 and again.scales() == (1.0, HEADROOM)


def test_a_finished_compile_keeps_its_outcome_period_rate_and_what_ran_out() -> None:
    state = start(SearchState(SETTINGS, 1.15), first(SearchState(SETTINGS, 1.15)), "a")
    done = learn(state, Finished(0, "ok", period_s=0.5, throughput=8.0)).attempts[0]
    assert (done.outcome, done.period_s, done.throughput, done.oom) == ("ok", 0.5, 8.0, None)
    over = learn(state, Finished(0, "oom", oom="stream")).attempts[0]
    assert (over.outcome, over.oom) == ("oom", "stream")


def test_an_invalid_compile_ends_the_search_as_its_cause_unless_a_plan_compiled() -> None:
    """Stages that disagree with the model end it at once (``verification``), even after a fit;
    any other rejection only while no plan compiled; the first failure is the one kept."""
    state = SearchState(replace(SETTINGS, speculative_margins=(), probe=False), 1.15)
    state = start(start(state, first(state), "a"), replace(first(state), label="b"), "b")
    bad = learn(state, Finished(0, "invalid", cause="verification"))
    assert bad.failed == ("verification", 0) and next_attempts(bad) == Verdict(
        None, failed=("verification", 0)
    )
    rejected = learn(state, Finished(0, "invalid", cause="rejected"))
    assert rejected.failed == ("rejected", 0)
    assert learn(rejected, Finished(1, "invalid", cause="verification")).failed == ("rejected", 0)
    fitted = learn(state, Finished(1, "ok"))
    assert learn(fitted, Finished(0, "invalid", cause="rejected")).failed is None
    assert learn(fitted, Finished(0, "invalid", cause="verification")).failed == (
        "verification",
        0,
    )


def test_measured_node_times_are_kept_once_and_only_to_calibrate() -> None:
    times = (("n", 0.5),)
    plain = start(SearchState(SETTINGS, 1.15), first(SearchState(SETTINGS, 1.15)), "a")
    assert learn(plain, Finished(0, "ok", node_times=times)).measured_times is None
    cfg = replace(SETTINGS, calibrate=True)
    state = start(SearchState(cfg, 1.15), first(SearchState(cfg, 1.15)), "a")
    assert learn(state, Finished(0, "ok")).measured_times is None
    kept = learn(state, Finished(0, "ok", node_times=times))
    assert kept.measured_times == times
    later = replace(kept, attempts=(*kept.attempts, replace(kept.attempts[0], index=1)))
    assert learn(later, Finished(1, "ok", node_times=(("n", 9.0),))).measured_times == times


def test_a_running_plan_predicted_no_faster_than_the_fit_is_not_waited_for() -> None:
    state = SearchState(SETTINGS, 1.15)
    state = start(state, first(state), "a", predicted_s=1.0)
    spec = next_attempts(state)[1]  # type: ignore[index]
    state = start(state, spec, "b", predicted_s=1.0)
    assert next_attempts(learn(state, Finished(0, "ok"))) == Verdict(0)


def test_with_the_budget_spent_a_running_compile_is_waited_for() -> None:
    cfg = replace(SETTINGS, max_attempts=1, probe=False, speculative_margins=())
    state = start(SearchState(cfg, 1.15), first(SearchState(cfg, 1.15)), "a")
    assert next_attempts(state) == ()
    end = next_attempts(learn(state, overflow(0, 0, 1.2)))
    assert isinstance(end, Verdict) and end.kept is None and not end.capped  # not ruled out


def test_the_verdict_s_note_is_every_doubt_then_the_amp_note_in_order() -> None:
    state = replace(SearchState(SETTINGS, 1.15), doubts=("; one", "; two"))
    assert verdict(state).note == "; one; two"


def test_a_stage_of_code_alone_is_hopeless_only_when_it_measured_more_than_its_code() -> None:
    """Nothing but code (a per-node constant) in the stage: no factor on bytes explains more than
    the code, so that is hopeless; a reading at or under the code needs no factor at all."""
    code_only = oom(0, stage(0, 0.8, code=1.0), 1.2)
    assert stage_factor(code_only, 0.8 + 1e-9) >= 1e6
    assert stage_factor(code_only, 0.8) == 1.0 and stage_factor(code_only, 0.5) == 1.0


def test_a_stage_that_measured_under_its_prediction_gets_a_factor_under_one() -> None:
    assert abs(stage_factor(oom(0, stage(0, 2.0), 1.2), 1.2) - 0.6) < 1e-12


def test_a_fixed_cost_is_the_inner_reading_net_of_its_code_and_its_bytes_at_the_rate() -> None:
    """Measured as is (``exact``): the rate between is (1.5 − 1.1 + 0.1) / 0.5 = 1.0, and the inner
    stage's fixed cost what its reading leaves after its code (0.1) and its rest at that rate
    (0.3): 0.7 of a device, kept with its nodes. A fixed cost within ``NOISE`` is none: the inner
    stage keeps its own factor instead."""
    outer, inner = oom(0, stage(0, 0.8, 0, 100), 1.5), oom(1, stage(1, 0.4, 0, 50, code=0.25), 1.1)
    model = content_model([outer, inner], amp=0.6, exact=True)
    (((_, rate),), ((nodes, fixed),)) = model.measured, model.fixed
    assert abs(rate - 1.0) < 1e-12 and nodes == ((0, 50),) and abs(fixed - 0.7) < 1e-12
    small = content_model(
        [oom(0, stage(0, 0.8, 0, 100), 2.38), oom(1, stage(1, 0.4, 0, 50), 1.2)],
        amp=0.6,
        exact=True,
    )
    assert small.fixed == () and [f for _, f in small.patches] == [pytest.approx(1.2 / 0.4)]
