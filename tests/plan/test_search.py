"""The search's memory model on recorded observation sequences (pure values, no compiles)."""

from __future__ import annotations

import numpy as np

from sharderd.plan.content import node_factors
from sharderd.plan.memory_model import (
    FIT_MIN_MEASURED_SPREAD,
    HEADROOM,
    HOPELESS,
    OOM_FLOOR,
    SYSTEMIC_CAP,
    UNKNOWN_OVER,
    UNMEASURED_SHARE,
    cautious,
    content_model,
    hypothesis,
    stage_factor,
    systemic_ratio,
)
from sharderd.plan.observations import (
    AttemptKey,
    Observation,
    StageView,
    observe,
)
from sharderd.plan.oom import OomInfo
from sharderd.plan.search import (
    SearchState,
    amp_closing,
    amp_for_plan,
    amp_retry,
    amp_saving,
    learn,
    stage_need,
)

TILE = 638_976
N = 700


def stage(
    device: int,
    predicted: float,
    start: int = 0,
    stop: int = 100,
    act: float = 0.1,
    code: float = 0.0,
) -> StageView:
    return StageView(
        device, predicted, act, "levels", start, stop, runs=((start, stop),), code_share=code
    )


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
    assert systemic_ratio(obs, amp=0.6) is None  # 1.657, 2.1 and 1.3 are not one ratio
    assert (later[100:300] == 1.0).all() and (later[600:] == 1.0).all()
    moved = factors([oom(0, stage(4, 0.6), 0.6 * 1.657)])  # the same layers on device 4
    assert np.array_equal(moved, first)


def test_same_factor_on_different_contents_is_one_bounded_systemic_factor() -> None:
    obs = [oom(0, stage(0, 0.6), 0.6 * 1.40), oom(1, stage(2, 0.6, 200, 300), 0.6 * 1.50)]
    assert abs((systemic_ratio(obs, amp=0.6) or 0) - 1.40) < 1e-9
    base = content_model(obs, amp=0.6).base
    again = [*obs, oom(2, stage(0, 0.5, 0, 80), 0.5 * 1.40)]  # a shrunk stage 0: same contents
    assert content_model(again, amp=0.6).base == base  # applied once, not compounded
    assert factors(again)[400] == base
    huge = [oom(0, stage(0, 0.3), 0.3 * 3.0), oom(1, stage(2, 0.3, 200, 300), 0.3 * 3.2)]
    assert systemic_ratio(huge, amp=0.6) == SYSTEMIC_CAP


def test_a_shrunk_stage_is_not_a_second_opinion() -> None:
    """Two overflows of (mostly) the same nodes are one piece of evidence, not a systemic one."""
    obs = [oom(0, stage(0, 0.8, 0, 80), 1.2), oom(1, stage(1, 0.6, 10, 70), 1.1)]
    assert systemic_ratio(obs, amp=0.6) is None


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
    assert stage_factor(oom(0, stage(0, 0.8, code=1.0), 1.2), 1.2) == HOPELESS


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
        a, b = o.stage.start, o.stage.stop
        code = o.stage.predicted * o.stage.code_share
        corrected = code + (o.stage.predicted - code) * f[a:b].min()
        assert corrected >= o.measured * (1 - FIT_MIN_MEASURED_SPREAD) - 1e-12
        assert corrected >= OOM_FLOOR - 1e-12
    near = obs[2].stage
    assert near is not None
    smaller = near.predicted * 0.95 * f[near.start : near.stop].min()
    assert smaller < 1.0


def test_hypothesis_gives_the_worst_factor_to_unmeasured_nodes_only_when_it_changes_something() -> (
    None
):
    assert hypothesis([], amp=0.6) is None
    obs = [oom(0, stage(0, 0.6), 0.6 * 1.5)]
    guess = hypothesis(obs, amp=0.6)
    assert guess is not None and abs(guess.base - 1.5 * HEADROOM) < 1e-9
    systemic = [*obs, oom(1, stage(2, 0.6, 200, 300), 0.6 * 1.5)]
    assert hypothesis(systemic, amp=0.6) is None  # the systemic factor already covers them


def test_amp_retry_only_when_the_lower_cap_can_close_the_gap() -> None:
    short = oom(0, stage(0, 0.9), 1.55)
    assert amp_retry(short, 0.6, (0.3, 0.1)) is None  # 0.5 of a tile off at most: not 0.55
    near = oom(0, stage(0, 0.9), 1.05)
    assert amp_retry(near, 0.6, (0.3, 0.1)) == 0.3


def test_a_verdict_check_leaves_room_for_the_nodes_no_compile_measured() -> None:
    """One OOM measures one device; the cautious model takes every other node halfway
    (geometrically) to its factor, only ever raising factors, so what fits it fits the estimate."""
    obs = [oom(0, stage(1, 0.8, 100, 200), 0.8 * 1.21)]
    estimate = content_model(obs, amp=0.6, estimate=True)
    room = cautious(estimate)
    assert room is not None
    worst = estimate.peak()
    assert abs(room.base - worst**UNMEASURED_SHARE) < 1e-12 and 1.0 < room.base < worst
    assert (node_factors(room, N) >= node_factors(estimate, N)).all()
    assert cautious(SearchState(4, 1.0, 0.6, tuple(obs)).estimate_content()) == room
    # Two agreeing overflows give the unmeasured nodes a systemic factor, the smaller one: they
    # are taken halfway from it to the larger.
    agreed = content_model(
        [*obs, oom(1, stage(3, 0.8, 300, 400), 0.8 * 1.3)], amp=0.6, estimate=True
    )
    above = cautious(agreed)
    assert agreed.base > 1.0 and above is not None
    assert abs(above.base - agreed.base * (agreed.peak() / agreed.base) ** UNMEASURED_SHARE) < 1e-12
    assert cautious(content_model([], amp=0.6, estimate=True)) is None


def test_a_lower_cap_takes_off_at_most_what_was_above_it() -> None:
    """PopART's AMP is a per-tile cap on conv/matmul temporaries: lowering it from 0.6 to 0.3 can
    take at most 0.3 of a tile off, however large the tile's activations; not the fake's linear
    a/amp shrink, which would promise more where temporaries dominate."""
    assert abs(amp_saving(0.6, 0.3) - 0.3) < 1e-12 and amp_saving(0.3, 0.6) == 0.0
    assert amp_closing(1.25, 0.6, (0.3, 0.1)) == 0.3
    assert amp_closing(1.4, 0.6, (0.3, 0.1)) == 0.1
    assert amp_closing(1.6, 0.6, (0.3, 0.1)) is None
    assert amp_closing(1.05, 0.6, ()) is None


def test_an_amp_retry_closes_every_gap_the_compiles_know_not_only_the_named_one() -> None:
    """Recorded (transformer, largest op on 40% of tiles, 4 devices): the plan's OOM named device 0
    at 1.024; the verdict check's device 1, holding mostly the plan's device-1 nodes, measured
    1.134. The level is chosen for every gap the compiles know; one no level can close stops it."""
    plan = (
        stage(0, 0.851, 0, 75, act=0.131, code=0.377),
        stage(1, 0.921, 75, 152, act=0.121, code=0.357),
        stage(2, 0.895, 152, 235, act=0.124, code=0.396),
        stage(3, 0.885, 235, 308, act=0.126, code=0.353),
    )
    obs = [oom(0, plan[0], 1.024), oom(1, stage(1, 0.943, 88, 166, act=0.118, code=0.354), 1.134)]
    assert amp_retry(obs[0], 0.6, (0.3, 0.1)) == 0.3
    need = stage_need(plan[1], 0, obs, 0.6)
    assert 1.0 < need < 1.134  # carried over with the noise in the model's favour
    assert stage_need(plan[0], 0, obs, 0.6) == 1.024  # its own measurement
    assert stage_need(plan[2], 0, obs, 0.6) == plan[2].predicted  # nothing measured it
    assert amp_for_plan(plan, 0, obs, 0.6, (0.3, 0.1)) == (0.3, None, 0.0)
    assert amp_for_plan(plan, 0, obs, 0.6, (0.55, 0.3)) == (
        0.3,
        None,
        0.0,
    )  # 0.55 closes 1.024 only
    assert amp_for_plan(plan, 0, obs, 0.6, (0.55,)) == (None, plan[1], need)
    assert amp_for_plan(plan, 0, [], 0.6, (0.3, 0.1)) == (None, None, 0.0)
    numberless = [Observation(0, plan[0], False, None, 0.6)]
    assert stage_need(plan[0], 0, numberless, 0.6) == UNKNOWN_OVER


def test_observe_and_learn_keep_every_observation() -> None:
    views = (stage(0, 0.7), stage(1, 0.5, 100, 200))
    new = observe(
        0,
        views,
        kind="oom",
        amp=0.6,
        oom=OomInfo("tile", 1, 30, int(1.2 * TILE), TILE),
        tile_bytes=TILE,
    )
    assert [o.device for o in new] == [1] and abs((new[0].measured or 0) - 1.2) < 1e-5
    state, correction = learn(SearchState(2, 1.15, 0.6), AttemptKey("d", 0.6), new, views)
    assert state.scales() == (1.0, 1.0)  # nothing per device index
    f = node_factors(state.content(), N)
    assert (f[:100] == 1.0).all() and (f[100:200] > 2.0).all()
    assert correction is not None and correction.before == (1.0, 1.0)
    assert correction.after[0] == 1.0 and correction.after[1] > 2.0
    blind = observe(1, views, kind="oom", amp=0.6, oom=OomInfo("variables"))
    assert learn(state, AttemptKey("e", 0.6), blind)[0].scales() == (1.25, 1.25)


def test_an_oom_at_a_lower_amp_rules_the_split_out_at_the_default_too() -> None:
    """Lowering available_memory_proportion only lowers memory: the split that ran out at 0.3 is
    marked tried at 0.6 as well; its bytes stay evidence at 0.3 only."""
    state = SearchState(2, 1.15, 0.6)
    low = AttemptKey("abc", 0.3)
    after, _ = learn(state, low, [oom(0, stage(0, 0.8), 1.02, amp=0.3)])
    assert low in after.tried and AttemptKey("abc", 0.6) in after.tried
    assert after.content().identity  # the default's model is unchanged
    fitted, _ = learn(state, AttemptKey("abc", 0.6), [oom(0, stage(0, 0.8), 1.02)])
    assert fitted.tried == {AttemptKey("abc", 0.6)}


def test_without_contents_only_the_file_order_stands_for_nodes() -> None:
    plain = StageView(0, 0.6, 0.1, "file", 10, 20)
    assert plain.nodes() == ((10, 20),)
    assert StageView(0, 0.6, 0.1, "depth_first", 10, 20).nodes() == ()


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
