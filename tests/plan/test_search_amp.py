"""AMP retries per stage (``search.amp_per_stage``) on recorded events: only the overflowed
device's stage is lowered, by what a lower cap on temporaries can take off; a second device
overflowing spreads the level; an overflow naming no device retries the whole compile."""

from __future__ import annotations

from dataclasses import replace

from sharderd.errors import NoSplitError
from sharderd.plan.amp_retry import amp_retry, cap_too_small
from sharderd.plan.memory_model import amp_closing
from sharderd.plan.observations import AttemptKey, OomInfo, StageView, observe
from sharderd.plan.perf import worth_compiling
from sharderd.plan.search import learn, next_attempts
from sharderd.plan.search_state import Attempt, Finished, SearchState, Settings, Started, Verdict

TILE = 638_976
PLAN = (StageView(0, 0.7, ((0, 100),)), StageView(1, 0.5, ((100, 200),)))
SETTINGS = Settings(
    devices=2,
    margin=1.0,
    default_amp=0.6,
    fallbacks=(0.3, 0.1),
    max_attempts=8,
    amp_per_stage=True,
)
SETTLED = NoSplitError("the model as measured has no split")


def start(state: SearchState, attempt: Attempt) -> SearchState:
    key = AttemptKey("abc", attempt.amp, attempt.stage_amps)
    return learn(state, Started(len(state.attempts), attempt, key, 1.0))


def overflow(state: SearchState, device: int | None, measured: float) -> SearchState:
    """The last started attempt ran out of memory on ``device``, observed at that device's AMP."""
    a = state.attempts[-1]
    info = OomInfo("tile", device, 3, int(measured * TILE), TILE)
    if device is None:
        info = OomInfo("variables")
    amp = a.key.amp_on(device)
    return learn(
        state, Finished(a.index, "oom", observe(a.index, PLAN, kind="oom", amp=amp, oom=info))
    )


def settled_after_overflow(settings: Settings, device: int | None, measured: float) -> SearchState:
    state = SearchState(settings, 1.0)
    plan = next_attempts(state)
    assert isinstance(plan, tuple) and plan[0].kind == "plan"
    return replace(overflow(start(state, plan[0]), device, measured), settled=SETTLED)


def retry(state: SearchState) -> Attempt:
    wanted = next_attempts(state)
    assert isinstance(wanted, tuple) and len(wanted) == 1 and wanted[0].kind == "amp", wanted
    return wanted[0]


def test_only_the_overflowed_stage_is_lowered_by_what_a_cap_can_take_off() -> None:
    state = settled_after_overflow(SETTINGS, 1, 1.2)
    a = retry(state)
    assert (a.amp, a.stage_amps, a.of) == (0.6, (0.6, 0.3), 0)  # 0.3 off a tile closes 1.2
    assert a.label == "available_memory_proportion 0.3 on stage 1"
    deeper = retry(settled_after_overflow(SETTINGS, 0, 1.4))
    assert deeper.stage_amps == (0.1, 0.6)
    globally = retry(settled_after_overflow(replace(SETTINGS, amp_per_stage=False), 1, 1.2))
    assert (globally.amp, globally.stage_amps) == (0.3, None)


def test_the_same_stage_overflowing_again_goes_one_level_lower_from_its_own_cap() -> None:
    state = settled_after_overflow(SETTINGS, 1, 1.2)
    model = state.content()
    state = overflow(start(state, retry(state)), 1, 1.15)  # measured at stage 1's 0.3
    assert state.observations[-1].amp == 0.3 and state.content() == model  # not at the default
    again = retry(state)
    assert (again.stage_amps, again.of) == ((0.6, 0.1), 1)
    state = overflow(start(state, again), 1, 1.15)
    end = next_attempts(state)  # nothing lower than 0.1: not proven, and the note says why
    assert isinstance(end, Verdict) and end.kept is None and end.error is None
    assert "its stage at 0.1" in end.note


def test_a_second_device_overflowing_lowers_every_stage_still_above_the_level() -> None:
    state = settled_after_overflow(SETTINGS, 0, 1.2)
    state = overflow(start(state, retry(state)), 1, 1.1)
    spread = retry(state)
    assert spread.stage_amps == (0.3, 0.3)
    assert "every stage above it (device 1 overflowed too)" in spread.label
    low = settled_after_overflow(SETTINGS, 0, 1.4)  # stage 0 at 0.1 stays at 0.1
    low = overflow(start(low, retry(low)), 1, 1.2)
    assert retry(low).stage_amps == (0.1, 0.3)


def test_an_overflow_without_a_device_retries_the_whole_compile() -> None:
    a = retry(settled_after_overflow(SETTINGS, None, 1.0))
    assert (a.amp, a.stage_amps) == (0.3, None)
    state = settled_after_overflow(SETTINGS, 1, 1.2)
    state = overflow(start(state, retry(state)), None, 1.0)
    after = retry(state)
    assert (after.amp, after.stage_amps) == (0.3, None)


def test_an_overflow_without_a_device_at_the_lowest_level_says_none_is_left() -> None:
    """Named no device at 0.3 (one level above the lowest), the retry is 0.1; at 0.1 none is left,
    and the note says so, never a device or a gap it was not told."""
    state = settled_after_overflow(replace(SETTINGS, amp_per_stage=False), None, 1.0)
    state = overflow(start(state, retry(state)), None, 1.0)
    last = retry(state)
    assert (last.amp, last.of) == (0.1, 1)
    ended = next_attempts(overflow(start(state, last), None, 1.0))
    assert isinstance(ended, Verdict) and ended.kept is None
    assert ended.note == (
        "; no lower available_memory_proportion is left to try: attempt 2, whose overflow named "
        "no device, ran at 0.1, the lowest"
    )


def test_a_whole_compile_retry_on_a_per_stage_attempt_lowers_every_stage_above_it() -> None:
    """The per-stage attempt is the one to build on (its overflow, naming no device, is the
    smaller); the global retry takes every stage down to its level, none stays at the default, and
    a stage already lower keeps its own (else it compiles what the per-stage attempt did)."""
    state = settled_after_overflow(SETTINGS, 1, 1.3)
    state = overflow(start(state, retry(state)), None, 1.0)
    after = retry(state)
    assert (after.amp, after.stage_amps, after.of) == (0.3, None, 1)
    state = settled_after_overflow(SETTINGS, 1, 1.45)
    staged = retry(state)
    assert staged.stage_amps == (0.6, 0.1)
    after = retry(overflow(start(state, staged), None, 1.0))
    assert (after.amp, after.stage_amps, after.of) == (0.3, (0.3, 0.1), 1)


def test_a_split_that_overflowed_with_a_lowered_stage_is_not_compiled_at_the_default() -> None:
    state = settled_after_overflow(SETTINGS, 1, 1.2)
    state = replace(state, attempts=(), observations=(), settled=None)
    staged = Attempt("amp", "x", 1.0, (1.0, 1.0), SearchState(SETTINGS, 1.0).content(), 0.6)
    state = overflow(start(state, replace(staged, stage_amps=(0.6, 0.3))), 1, 1.02)
    plan = replace(staged, kind="plan", stage_amps=None)
    assert not worth_compiling(state, plan, AttemptKey("abc", 0.6), 1.0)
    assert worth_compiling(state, plan, AttemptKey("other", 0.6), 1.0)


def test_a_key_says_which_amp_each_device_had() -> None:
    key = AttemptKey("d", 0.6, (0.6, 0.3))
    assert (key.amp_on(0), key.amp_on(1), key.amp_on(None), key.lowest) == (0.6, 0.3, 0.3, 0.3)
    plain = AttemptKey("d", 0.6)
    assert (plain.amp_on(1), plain.lowest) == (0.6, 0.6)
    assert key != plain


def test_the_note_on_a_cap_too_small_gives_what_it_takes_off_and_the_gap() -> None:
    """From 0.6 down to 0.1 at most 50% of a tile comes off; 1.7 is 70% over. A cap not below the
    level takes nothing off (never a negative share)."""
    assert cap_too_small(0.1, 0.6, 2, "attempt 3", 1.7) == (
        "; a lower available_memory_proportion was not tried: it caps conv/matmul temporaries per "
        "tile, and even at 0.1 it takes at most 50% of a tile off device 2's worst tile "
        "(attempt 3), which is 70% over"
    )
    assert "takes at most 0% of a tile off" in cap_too_small(0.3, 0.1, 0, "x", 1.2)


def test_no_amp_retry_where_the_settled_node_alone_is_past_what_a_cap_takes_off() -> None:
    """The model as measured says node 'mm' alone needs 1.6× a device: from 0.6 down to 0.1 at
    most 50% of a tile comes off, so no retry, and the note says so; at 1.5× (exactly 0.5 over)
    the retry at 0.1 could close it, and it is made."""
    cfg = replace(SETTINGS, amp_per_stage=False)
    state = settled_after_overflow(cfg, 1, 1.2)
    far = NoSplitError("no split")
    far.node, far.node_need = "mm", 1.6
    retry, note = amp_retry(replace(state, settled=far))
    assert retry is None and note == (
        "; a lower available_memory_proportion was not tried: 'mm' alone needs 1.60× a device, "
        "and a cap on temporaries of 0.1 instead of 0.6 takes at most 50% of a tile off"
    )
    near = NoSplitError("no split")
    near.node, near.node_need = "mm", 1.5
    retry, note = amp_retry(replace(state, settled=near))
    assert retry is not None and (retry.amp, retry.label, note) == (
        0.3,
        "available_memory_proportion 0.3",
        "",
    )


def test_a_probe_s_overflow_is_no_split_to_retry_at_a_lower_amp() -> None:
    state = SearchState(replace(SETTINGS, amp_per_stage=False), 1.0)
    probe = Attempt("probe", "probe", 1.0, (1.0,), state.content(), 0.1)
    state = learn(state, Started(0, probe, AttemptKey("probe:n", 0.1), 0.0))
    state = learn(
        state,
        Finished(
            0,
            "oom",
            observe(0, PLAN[:1], kind="oom", amp=0.1, oom=OomInfo("tile", 0, 3, 2 * TILE, TILE)),
        ),
    )
    assert amp_retry(replace(state, settled=SETTLED)) == (None, "")


def test_a_retry_already_started_is_not_asked_again() -> None:
    cfg = replace(SETTINGS, amp_per_stage=False)
    state = settled_after_overflow(cfg, 1, 1.2)
    retry, _ = amp_retry(state)
    assert retry is not None
    running = learn(state, Started(1, retry, AttemptKey("abc", retry.amp), 1.0))
    assert amp_retry(running) == (None, "")


def test_a_per_stage_retry_builds_on_the_smaller_of_two_overflows_at_the_default() -> None:
    """Two splits overflowed at the default AMP, one by 1.4, one by 1.2: the retry lowers the
    second's device, by what closes 1.2 (0.3), and its stage-level note is empty."""
    state = SearchState(SETTINGS, 1.0)
    plan = next_attempts(state)[0]  # type: ignore[index]
    state = learn(state, Started(0, plan, AttemptKey("big", 0.6), 1.0))
    state = learn(state, Started(1, replace(plan, label="b"), AttemptKey("small", 0.6), 1.0))
    for index, device, measured in ((0, 0, 1.4), (1, 1, 1.2)):
        info = OomInfo("tile", device, 3, int(measured * TILE), TILE)
        obs = observe(index, PLAN, kind="oom", amp=0.6, oom=info)
        state = learn(state, Finished(index, "oom", obs))
    retry, note = amp_retry(replace(state, settled=SETTLED))
    assert retry is not None and note == ""
    assert (retry.of, retry.stage_amps) == (1, (0.6, 0.3))


def test_a_stage_at_the_lowest_level_says_which_device_and_attempt() -> None:
    state = settled_after_overflow(SETTINGS, 1, 1.45)
    staged = retry(state)
    assert staged.stage_amps == (0.6, 0.1)
    state = overflow(start(state, staged), 1, 1.3)
    ended = next_attempts(replace(state, settled=SETTLED))
    assert (
        isinstance(ended, Verdict)
        and "off device 1's worst tile (attempt 1, its stage at 0.1)" in ended.note
    )


def test_a_lower_level_closes_a_gap_exactly_its_difference_and_the_same_level_none() -> None:
    assert amp_closing(1.25, 0.5, (0.25,)) == 0.25  # 1.25 - 0.25 is exactly 1: it fits
    assert amp_closing(1.0, 0.6, (0.6, 0.3)) == 0.3  # the current level is no retry
    assert amp_closing(1.0, 0.6, (0.6,)) is None


def test_the_last_compile_the_budget_allows_lowers_every_stage() -> None:
    """Ruled out before any compile (2 compiles): after the first overflow on device 1 the second
    is the last, so its AMP retry lowers every stage (no compile would be left to lower the next
    device that overflows); one compile more in the budget, and it lowers stage 1 alone."""
    state = replace(settled_after_overflow(SETTINGS, 1, 1.2), ruled_out=True)
    assert state.budget() == 2 and len(state.attempts) == 1
    last = retry(state)
    assert (last.amp, last.stage_amps, last.label) == (0.3, None, "available_memory_proportion 0.3")
    roomy = retry(replace(state, settings=replace(SETTINGS, max_attempts=3), ruled_out=False))
    assert (roomy.amp, roomy.stage_amps) == (0.6, (0.6, 0.3))
    at_three = replace(state, settings=replace(SETTINGS, max_attempts=2), ruled_out=False)
    assert retry(at_three).stage_amps is None  # --max-attempts 2: the same last compile
