"""job/verdict: how a finished search ends (``ending``: the kept plan, the proof, the failure or
"not proven", each with its message), and ``fewest_devices``, the smallest device count with a
split, found by doubling and halving, compared with a walk over every count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sharderd.backends.protocol import AttemptOutcome
from sharderd.errors import (
    CompileFailedError,
    ConfigError,
    NotProvenError,
    PlanInfeasibleError,
    VerificationError,
)
from sharderd.job.attempts import AttemptRecord, ProveResult
from sharderd.job.session import PlanRequest
from sharderd.job.verdict import ending, fewest_devices
from sharderd.plan.observations import AttemptKey, OomInfo
from sharderd.plan.search import Verdict
from sharderd.target import BUILTIN_TARGETS


class _Session:
    """A model with a split from ``first`` devices on, and nodes for at most ``most``."""

    def __init__(self, first: int | None, most: int) -> None:
        self.first, self.most, self.asked = first, most, []

    async def plan(self, request: PlanRequest) -> Any:
        n = request.devices
        self.asked.append(n)
        if n > self.most:
            raise ConfigError(f"{n} devices for {self.most} nodes")
        if self.first is None or n < self.first:
            raise NotProvenError("no split")
        return None


@pytest.mark.anyio
@pytest.mark.parametrize("devices", [1, 2, 5])
@pytest.mark.parametrize("most", [6, 7, 13, 40])
async def test_fewest_devices_matches_a_walk_over_every_count(devices: int, most: int) -> None:
    for first in [None, *range(devices + 1, most + 2)]:
        session = _Session(first, most)
        found = await fewest_devices(session, lambda n: PlanRequest(n, 1.0), devices)  # type: ignore[arg-type]
        walk = next((n for n in range(devices + 1, most + 1) if first and n >= first), None)
        assert found == walk, (first, most, session.asked)
        assert len(session.asked) <= 2 * max(1, most - devices).bit_length() + 1


@pytest.mark.anyio
async def test_fewest_devices_doubles_then_halves_in_whole_counts() -> None:
    """From 1 device, a split from 6 on: 2, 3, 5, 9 (the extra devices double), then 7, 6 (the
    gap halves); every count asked is a whole number of devices."""
    session = _Session(6, 40)
    found = await fewest_devices(session, lambda n: PlanRequest(n, 1.0), 1)  # type: ignore[arg-type]
    assert found == 6 and type(found) is int
    assert session.asked == [2, 3, 5, 9, 7, 6]
    assert all(type(n) is int for n in session.asked)


# --- ending: how a finished search ends, from its verdict ----------------------------------------

TARGET = BUILTIN_TARGETS["ipu-mk2"]
TILE = TARGET.bytes_per_tile


def _record(index: int, outcome: AttemptOutcome | None, **extra: Any) -> AttemptRecord:
    return AttemptRecord(
        index=index,
        label="probe" if "probe_node" in extra else "plan",
        key=AttemptKey(f"d{index}", 0.1 if "probe_node" in extra else 0.6),
        margin=1.0,
        scale=(1.0,),
        orders=None,
        plan=None,
        views=(),
        model=Path("m.onnx"),
        directory=Path(),
        request=None,
        outcome=outcome,
        **extra,
    )


OOM = AttemptOutcome("oom", "Out of memory", oom=OomInfo("tile", 1, 3, int(1.25 * TILE), TILE))


async def _end(verdict: Verdict, *records: AttemptRecord) -> ProveResult:
    async def fewest() -> int | None:
        return 6

    return await ending(
        records, verdict, devices=4, target=TARGET, backend="poprt", max_attempts=8, fewest=fewest
    )


@pytest.mark.anyio
async def test_a_kept_plan_carries_the_probe_proof_it_contradicts() -> None:
    records = (_record(0, AttemptOutcome("ok")), _record(1, OOM, probe_node="conv"))
    assert (await _end(Verdict(0), *records)).contradiction is None
    result = await _end(Verdict(0, contradiction=1), *records)
    assert result.chosen is records[0] and result.contradiction is not None
    assert (result.contradiction.probe, result.contradiction.fitted) == (1, 0)
    assert "node 'conv' compiled alone on one device" in result.contradiction.proof


@pytest.mark.anyio
async def test_the_probe_proof_is_exit_3_on_its_grounds() -> None:
    records = (_record(0, None), _record(1, OOM, probe_node="conv"))
    with pytest.raises(PlanInfeasibleError) as info:
        await _end(Verdict(None, proof=1), *records)
    err = info.value
    assert err.exit_code == 3 and err.grounds == "probe" and err.node == "conv"
    assert "at available_memory_proportion 0.1 (attempt 1) ran out of memory" in err.message
    assert "worst tile" in err.message and err.device == 1


@pytest.mark.anyio
async def test_the_probe_proof_names_its_node_as_the_probe_recorded_it() -> None:
    """The node is the probe's typed field, not read back out of a label: a name with quotes (and
    one that starts like the label's wording) comes through whole."""
    for name in ("conv'", "node 'x'"):
        records = (_record(0, None), _record(1, OOM, probe_node=name))
        with pytest.raises(PlanInfeasibleError) as info:
            await _end(Verdict(None, proof=1), *records)
        assert info.value.node == name
        assert f"node {name!r} compiled alone" in info.value.message


@pytest.mark.anyio
async def test_a_failed_compile_ends_as_its_failure() -> None:
    bad = AttemptOutcome("invalid", "stages disagree\nmore", cause="verification")
    with pytest.raises(VerificationError, match="stages disagree"):
        await _end(Verdict(None, failed=("verification", 0)), _record(0, bad))
    rejected = AttemptOutcome("invalid", "bad attribute\ndetail")
    with pytest.raises(CompileFailedError) as info:
        await _end(Verdict(None, failed=("rejected", 0)), _record(0, rejected))
    assert info.value.message == "the poprt backend rejected the sharded model: bad attribute"
    with pytest.raises(CompileFailedError) as empty:
        await _end(Verdict(None, failed=("rejected", 0)), _record(0, AttemptOutcome("invalid")))
    assert empty.value.message.endswith("rejected the sharded model: no message")


@pytest.mark.anyio
async def test_not_proven_says_why_the_search_stopped() -> None:
    records = (_record(0, OOM), _record(1, OOM))
    with pytest.raises(NotProvenError) as info:
        await _end(Verdict(None), *records)
    assert "2 compile(s), 2 ran out of memory, last on device 1" in info.value.message
    assert "the compile budget (8) is spent" in info.value.message
    assert info.value.min_devices == 6 and info.value.exit_code == 5
    with pytest.raises(NotProvenError) as capped:
        await _end(Verdict(None, capped=True, note="; a note"), *records)
    assert "at most 2 compiles are tried" in capped.value.message
    assert "budget" not in capped.value.message and "; a note." in capped.value.message
    settled = NotProvenError("the estimate: no split", hint="rerun with --devices 5")
    with pytest.raises(NotProvenError) as before:
        await _end(Verdict(None, settled=settled))
    assert before.value.message == "the estimate: no split" and before.value.hint == settled.hint
    with pytest.raises(CompileFailedError, match=r"no plan compiled after 1 attempt\(s\)"):
        await _end(Verdict(None), _record(0, AttemptOutcome("crashed", "segfault")))


@pytest.mark.anyio
async def test_not_proven_after_compiles_names_the_last_overflow_and_the_measured_model() -> None:
    """Two overflows (devices 0 then 1) and a settled measured model with a node over a device:
    the message is the compiles' (never the estimate's alone), names the last overflow's device
    and worst tile, and the node; the hint is the device count the measurements suggest."""
    first = AttemptOutcome("oom", "Out of memory", oom=OomInfo("tile", 0, 3, TILE + 1, TILE))
    settled = NotProvenError("the estimate's own words", min_devices=9)
    settled.node, settled.node_need = "conv", 1.37
    with pytest.raises(NotProvenError) as info:
        await _end(Verdict(None, settled=settled), _record(0, first), _record(1, OOM))
    message = info.value.message
    assert message.startswith("no fitting split found on 4 × ipu-mk2 (not proven): 2 compile(s)")
    assert ", last on device 1 (worst tile 780.00 KiB of 624.00 KiB)" in message
    assert "no split fits the memory model fitted to these compiles (an estimate: not a proof)" in (
        message
    )
    assert "under which node 'conv' alone needs 1.37× a device" in message
    assert message.endswith(". The measurements suggest 6 devices.")
    assert info.value.hint == "rerun with --devices 6" and info.value.min_devices == 6
    assert info.value.device == 1 and "estimate's own words" not in message
    probe = _record(2, OOM, probe_node="conv")
    with pytest.raises(NotProvenError) as last_probe:
        await _end(Verdict(None, settled=settled), _record(0, first), probe)
    assert ", last node 'conv' compiled alone on one device (worst tile" in last_probe.value.message
    settled.node = None
    with pytest.raises(NotProvenError) as plain:
        await _end(Verdict(None, settled=settled), _record(0, first))
    assert plain.value.message.endswith(
        "(an estimate: not a proof). The measurements suggest 6 devices."
    )
    before = NotProvenError("no split", hint="rerun with --devices 5", min_devices=5)
    with pytest.raises(NotProvenError) as estimate:
        await _end(Verdict(None, settled=before))
    assert estimate.value.min_devices == 5


@pytest.mark.anyio
async def test_not_proven_after_an_overflow_that_named_no_device_says_so() -> None:
    """A host-stream overflow (and a numberless one) names no device: the message says what ran
    out and that no device was named, never "device None"."""
    for kind, what in (("stream", "host-stream memory"), ("variables", "memory")):
        lost = AttemptOutcome("oom", "Out of memory", oom=OomInfo(kind))  # type: ignore[arg-type]
        with pytest.raises(NotProvenError) as info:
            await _end(Verdict(None), _record(0, OOM), _record(1, lost))
        message = info.value.message
        assert f", last out of {what} on a device the compiler did not name;" in message
        assert "None" not in message and info.value.device is None


@pytest.mark.anyio
async def test_not_proven_with_no_device_count_says_what_to_change() -> None:
    async def none() -> int | None:
        return None

    with pytest.raises(NotProvenError) as info:
        await ending(
            (_record(0, OOM),),
            Verdict(None),
            devices=4,
            target=TARGET,
            backend="poprt",
            max_attempts=8,
            fewest=none,
        )
    assert "suggest" not in info.value.message and info.value.min_devices is None
    assert info.value.reruns == () and info.value.message.endswith("is spent.")
    assert info.value.hint == (
        "no split fits the fitted model on any number of devices the model has nodes for: "
        "reduce the batch or the model, or use a target with more memory"
    )


@pytest.mark.anyio
async def test_a_kept_plan_carries_every_attempt_and_a_contradiction_names_the_devices() -> None:
    records = (_record(0, AttemptOutcome("ok")), _record(1, OOM, probe_node="conv"))
    result = await _end(Verdict(0, contradiction=1), *records)
    assert result.attempts == records
    assert result.contradiction is not None
    assert result.contradiction.proof.startswith("the model does not fit on 4 × ipu-mk2: ")


@pytest.mark.anyio
async def test_the_probe_proof_says_the_devices_the_hint_and_a_serialized_factor() -> None:
    serial = _record(1, OOM, probe_node="mm")
    serial.key = AttemptKey("probe:mm", 0.1, serialize=(("mm", 8),))
    with pytest.raises(PlanInfeasibleError) as info:
        await _end(Verdict(None, proof=1), _record(0, None), serial)
    err = info.value
    assert err.message.startswith("the model does not fit on 4 × ipu-mk2: node 'mm' compiled alone")
    assert (
        "at available_memory_proportion 0.1 even with its matmul serialized ×8 "
        "(__serialize_matmul_mode output_channels, the most pieces sharderd asks for) (attempt 1)"
    ) in err.message
    assert err.hint == "reduce batch_size or the op's size, or use a target with more memory"
    numberless = _record(1, AttemptOutcome("oom", "Out of memory"), probe_node="mm")
    with pytest.raises(PlanInfeasibleError) as plain:
        await _end(Verdict(None, proof=1), _record(0, None), numberless)
    assert plain.value.device is None and "worst tile" not in plain.value.message


@pytest.mark.anyio
async def test_no_plan_compiled_lists_each_outcome_and_the_last_message() -> None:
    records = (
        _record(
            0, AttemptOutcome("crashed", "segfault in poplar\nmore", stderr_tail="core dumped  ")
        ),
        _record(1, None),
        _record(2, AttemptOutcome("timeout", "")),
    )
    with pytest.raises(CompileFailedError) as info:
        await _end(Verdict(None), *records)
    assert info.value.message == (
        "no plan compiled after 3 attempt(s) (#0 crashed, #1 cancelled, #2 timeout)"
    )
    assert info.value.hint == (
        "see report.json attempts[] for each outcome; raise attempt_timeout if compiles time out"
    )
    with pytest.raises(CompileFailedError) as first:
        await _end(Verdict(None), records[0], records[1])
    assert first.value.message.endswith("; last: segfault in poplar core dumped")
    with pytest.raises(CompileFailedError) as none:
        await _end(Verdict(None), records[1])
    assert none.value.message == "no plan compiled after 1 attempt(s) (#1 cancelled)"


@pytest.mark.anyio
async def test_a_rejected_compile_s_hint_points_at_the_full_text() -> None:
    rejected = _record(0, AttemptOutcome("invalid", "bad attribute\nline 2", cause="rejected"))
    with pytest.raises(CompileFailedError) as info:
        await _end(Verdict(None, failed=("rejected", 0)), rejected)
    assert info.value.message == "the poprt backend rejected the sharded model: bad attribute"
    assert info.value.hint == "see report.json attempts[].message for the full compiler text"
    with pytest.raises(CompileFailedError) as bare:
        await _end(Verdict(None, failed=("rejected", 0)), _record(0, None))
    assert bare.value.message == "the poprt backend rejected the sharded model: no message"


@pytest.mark.anyio
async def test_not_proven_carries_the_settled_shortfall_and_a_rerun_only_with_a_count() -> None:
    settled = NotProvenError("the estimate", short_bytes=4096)
    with pytest.raises(NotProvenError) as info:
        await _end(Verdict(None, settled=settled), _record(0, OOM))
    assert info.value.short_bytes == 4096 and info.value.reruns == ({"devices": 6},)
    with pytest.raises(NotProvenError) as capped:
        await _end(Verdict(None, capped=True), _record(0, OOM))
    assert (
        "; the estimate with the safety margin ruled every split out before any compile, so at "
        "most 2 compiles are tried: the split closest to fitting, then one its overflow left room "
        "for." in capped.value.message
    )
    assert capped.value.short_bytes is None


@pytest.mark.anyio
async def test_the_worst_tile_needs_its_bytes_and_falls_back_to_the_target_s_tile() -> None:
    no_bytes = AttemptOutcome("oom", "Out of memory", oom=OomInfo("tile", 1, 3, None, TILE))
    no_tile = AttemptOutcome("oom", "Out of memory", oom=OomInfo("tile", 1, 3, TILE + 1, None))
    for outcome, expected in (
        (no_bytes, ", last on device 1;"),
        (no_tile, "(worst tile 624.00 KiB of 624.00 KiB);"),
    ):
        with pytest.raises(NotProvenError) as info:
            await _end(Verdict(None), _record(0, outcome))
        assert expected in info.value.message
