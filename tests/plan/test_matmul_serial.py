"""PopART's matmul serialization in the search: a MatMul probe that overflows at the lowest AMP is
compiled again serialized; its overflow there is the proof, its fit what every later attempt writes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan.test_search import SETTINGS, TILE, first, overflow

from sharderd.errors import NoSplitError
from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import AttemptKey, OomInfo, Serialization, StageView, observe
from sharderd.plan.probe import MAX_SERIAL_FACTOR, probe_proves, serial_factor
from sharderd.plan.search import learn, next_attempts
from sharderd.plan.search_state import Attempt, Finished, SearchState, Started, Verdict

PROBE_VIEW = (StageView(0, 0.6, ((5, 6),)),)


@pytest.mark.parametrize(
    ("op", "shape", "factor"),
    [
        ("MatMul", (320, 1024), MAX_SERIAL_FACTOR),
        ("MatMul", (4, 128, 96), 16),
        ("MatMul", (8, 24), 8),
        ("MatMul", (8, 6), 2),
        ("MatMul", (8, 2), 2),  # the fewest channels that still split
        ("MatMul", (4, 96, 2), 2),  # the last axis, not the second nor the second to last
        ("MatMul", (2, 7, 64), 16),
        ("MatMul", (4, 1, 64), 16),  # a 1 on another axis is not the channels
        ("MatMul", (8, 7), 0),
        ("MatMul", (8, 1), 0),
        ("MatMul", None, 0),
        ("Gemm", (320, 1024), 0),
        ("Conv", (1, 64, 8, 8), 0),
    ],
)
def test_the_factor_is_the_largest_power_of_two_up_to_the_cap_dividing_the_output_channels(
    op: str, shape: tuple[int, ...] | None, factor: int
) -> None:
    found = serial_factor(op, shape)
    assert found == factor and type(found) is int  # a factor PopART reads as an INT


def _probe_oom(index: int, amp: float = 0.1, compiled: Serialization = ()) -> Finished:
    """A probe ran out of the tiles' memory; ``compiled``: the serialization its model carried."""
    info = OomInfo("tile", 0, 3, int(1.05 * TILE), TILE)
    obs = observe(index, PROBE_VIEW, kind="oom", amp=amp, oom=info)
    return Finished(index, "oom", obs, oom="tile", compiled_serialize=compiled)


def _running(serializable: tuple[str, int] | None) -> tuple[SearchState, Attempt]:
    """The first plan and the probe started, as ``job/prove.py`` starts them."""
    state = SearchState(SETTINGS, 1.15)
    plan = first(state)
    state = learn(state, Started(0, plan, AttemptKey("a", 0.6), 1.0))
    probe = next_attempts(state)[0]  # type: ignore[index]
    assert probe.kind == "probe" and probe.amp == 0.1 and not probe.serialize
    key = AttemptKey("probe:mm", 0.1)
    state = learn(state, Started(1, probe, key, 0.0, serializable=serializable))
    return state, plan


def test_a_matmul_probe_that_overflows_is_compiled_again_serialized_before_anything_else() -> None:
    state, _ = _running(("mm", 16))
    assert not probe_proves(state.attempts[1], 0.1)  # the prover raises no proof on it
    state = learn(learn(state, overflow(0, 1, 1.3)), _probe_oom(1))
    wanted = next_attempts(state)
    assert isinstance(wanted, tuple) and len(wanted) == 1
    serial = wanted[0]
    assert (serial.kind, serial.amp, serial.serialize) == ("probe", 0.1, (("mm", 16),))
    assert state.proof is None and state.doubts == ()  # no proof yet, and nothing to doubt
    key = AttemptKey("probe:mm", 0.1, serialize=serial.serialize)
    state = learn(state, Started(2, serial, key, 0.0, serializable=("mm", 16)))
    assert next_attempts(state) == ()  # its outcome decides what the re-plan writes: wait
    assert probe_proves(state.attempts[2], 0.1)


def test_a_probe_that_is_no_serializable_matmul_or_above_the_lowest_amp_proves_as_before() -> None:
    state, _ = _running(None)
    assert probe_proves(state.attempts[1], 0.1)
    assert not probe_proves(state.attempts[1], 0.05)  # a lower AMP is still allowed
    state = learn(learn(state, overflow(0, 1, 1.3)), _probe_oom(1))
    assert next_attempts(state) == Verdict(None, proof=1)  # no serialized retry: the proof


def test_the_serialized_probe_overflowing_is_the_proof() -> None:
    state, _ = _running(("mm", 16))
    state = learn(learn(state, overflow(0, 1, 1.3)), _probe_oom(1))
    serial = next_attempts(state)[0]  # type: ignore[index]
    key = AttemptKey("probe:mm", 0.1, serialize=serial.serialize)
    state = learn(state, Started(2, serial, key, 0.0, serializable=("mm", 16)))
    ended = next_attempts(learn(state, _probe_oom(2, compiled=(("mm", 16),))))
    assert ended == Verdict(None, proof=2)


def test_a_serialized_probe_that_fits_is_written_by_every_later_attempt() -> None:
    """The fit adopts the serialization; what compiles without it measure is set aside, so the
    re-plan is the plain plan again, keyed apart from the one compiled without it."""
    state, plan = _running(("mm", 16))
    state = learn(state, _probe_oom(1))
    serial = next_attempts(state)[0]  # type: ignore[index]
    assert serial.serialize == (("mm", 16),)  # the first plan still running does not hold it up
    key = AttemptKey("probe:mm", 0.1, serialize=serial.serialize)
    state = learn(state, Started(2, serial, key, 0.0, serializable=("mm", 16)))
    state = learn(state, Finished(2, "ok", observe(2, PROBE_VIEW, kind="ok", amp=0.1)))
    assert state.serialized == (("mm", 16),) and state.observations == ()
    assert next_attempts(state) == ()  # the first plan's outcome may still end the search
    state = learn(state, overflow(0, 1, 1.3))
    assert state.observations == ()  # compiled without the serialization: it teaches nothing now
    replan = first(state)
    assert replan.kind == "plan" and replan.serialize == (("mm", 16),)
    assert replan.content == ContentCorrection()
    assert replan == replace(plan, serialize=replan.serialize)
    tried = AttemptKey("a", 0.6)
    serialized = replace(tried, serialize=replan.serialize)
    assert tried in state.tried() and serialized not in state.tried()
    state = learn(learn(state, Started(3, replan, serialized, 1.0)), overflow(3, 0, 1.2))
    retry = first(state)  # a re-plan after its overflow writes the serialization still
    assert retry.serialize == (("mm", 16),) and not retry.content.identity


def test_a_serialized_probe_whose_compiled_model_lost_the_attributes_proves_nothing() -> None:
    """The request asked for ×16, but the compiled model (as the backend read it back) carried no
    serialization, or another factor: its overflow is no proof, and the message says why."""
    for compiled in ((), (("mm", 8),), None):
        state, _ = _running(("mm", 16))
        state = learn(learn(state, overflow(0, 1, 1.3)), _probe_oom(1))
        serial = next_attempts(state)[0]  # type: ignore[index]
        key = AttemptKey("probe:mm", 0.1, serialize=serial.serialize)
        state = learn(state, Started(2, serial, key, 0.0, serializable=("mm", 16)))
        lost = learn(state, replace(_probe_oom(2), compiled_serialize=compiled))
        assert lost.proof is None
        assert lost.doubts == (
            "; the serialized probe (attempt 2) compiled a model without __serialize_matmul_* on "
            "'mm' ×16 (lost in PopRT's conversion), so its overflow proves nothing",
        )


def test_only_a_serialized_probe_that_fits_starts_the_measurements_again() -> None:
    """Its fit sets aside what the search learned without the serialization: the observations,
    the escalated re-plans and the planner's refusals. A plain probe that fits, or the serialized
    one overflowing, changes none of them."""
    state, _ = _running(("mm", 16))
    state = learn(learn(state, overflow(0, 1, 1.3)), _probe_oom(1))
    serial = next_attempts(state)[0]  # type: ignore[index]
    key = AttemptKey("probe:mm", 0.1, serialize=serial.serialize)
    state = learn(state, Started(2, serial, key, 0.0, serializable=("mm", 16)))
    err = NoSplitError("none")
    learned_much = replace(
        state, escalation=(1.0, 1.05), escalations=1, no_split=(1, err), settled=err
    )
    fit = learn(learned_much, Finished(2, "ok", observe(2, PROBE_VIEW, kind="ok", amp=0.1)))
    assert fit.serialized == (("mm", 16),) and fit.observations == ()
    assert (fit.escalation, fit.escalations, fit.no_split, fit.settled) == ((), 0, None, None)
    over = learn(learned_much, _probe_oom(2, compiled=(("mm", 16),)))
    assert over.serialized == () and over.escalations == 1 and over.settled is err
    plain, _ = _running(None)
    plain = replace(plain, escalations=1, settled=err)
    fits = learn(plain, Finished(1, "ok", observe(1, PROBE_VIEW, kind="ok", amp=0.1)))
    assert fits.serialized == () and fits.escalations == 1 and fits.settled is err


def test_a_matmul_probe_out_of_host_stream_memory_is_not_compiled_again_serialized() -> None:
    """Serializing the matmul changes its tiles' temporaries, not the host stream that ran out."""
    state, _ = _running(("mm", 16))
    stream = learn(learn(state, overflow(0, 1, 1.3)), Finished(1, "oom", oom="stream"))
    wanted = next_attempts(stream)
    assert not (isinstance(wanted, tuple) and any(a.serialize for a in wanted))
    assert stream.proof is None
