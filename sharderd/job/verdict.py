"""How a finished search ends: the kept plan, a proof that no split fits (exit 3), or "no fitting
split found (not proven)" (exit 5) with what was tried and what the compiles showed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sharderd.errors import (
    CompileFailedError,
    ConfigError,
    NoSplitError,
    NotProvenError,
    PlanInfeasibleError,
    SharderdError,
    VerificationError,
)
from sharderd.job.attempts import AttemptRecord, Contradiction, ProveResult
from sharderd.job.session import PlanRequest, PlanSession
from sharderd.plan.observations import OomInfo
from sharderd.plan.probe import SERIAL_MODE
from sharderd.plan.search_state import RULED_OUT, Failure, Verdict
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["ending", "fewest_devices", "probe_proof"]


def probe_proof(record: AttemptRecord, devices: int, target: Target) -> PlanInfeasibleError:
    """Ground (c): one node compiled alone on one device at the lowest AMP ran out of memory (the
    search decided it is the proof: ``plan.probe.why_no_proof``)."""
    oom = record.outcome.oom if record.outcome is not None else None
    serial = "".join(
        f" even with its matmul serialized ×{k} (__serialize_matmul_mode {SERIAL_MODE}, the most "
        f"pieces sharderd asks for)"
        for _, k in record.key.serialize
    )
    error = PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: node {record.probe_node!r} compiled alone on one "
        f"device at available_memory_proportion {record.key.amp:g}{serial} (attempt {record.index}) ran out "
        f"of memory{_worst_tile(oom, target)}, and every split holds it on some device, so no number of devices helps",
        grounds="probe",
        hint="reduce batch_size or the op's size, or use a target with more memory",
        device=None if oom is None else oom.device,
    )
    error.node = record.probe_node
    return error


async def ending(
    attempts: Sequence[AttemptRecord],
    verdict: Verdict,
    *,
    devices: int,
    target: Target,
    backend: str,
    max_attempts: int,
    fewest: Callable[[], Awaitable[int | None]],
) -> ProveResult:
    """The kept plan (with any probe proof it contradicts), else the error the search decided on:
    a proof (exit 3 only on ``errors.GROUNDS``), a failed compile, or exit 5 when the model as
    measured is settled or any compile ran out of memory."""
    if verdict.kept is not None:
        contradiction = None
        if verdict.contradiction is not None:
            probe = attempts[verdict.contradiction]
            proof = probe_proof(probe, devices, target)
            contradiction = Contradiction(probe.index, verdict.kept, proof.message)
        return ProveResult(attempts[verdict.kept], tuple(attempts), contradiction)
    if verdict.error is not None:
        raise verdict.error
    if verdict.proof is not None:
        raise probe_proof(attempts[verdict.proof], devices, target)
    if verdict.failed is not None:
        raise _failure(verdict.failed, attempts, backend)
    settled, note = verdict.settled, verdict.note
    ooms = [a for a in attempts if a.outcome is not None and a.outcome.outcome == "oom"]
    if settled is not None or ooms:
        limit = RULED_OUT if verdict.capped else max_attempts
        raise await _not_proven(
            ooms, settled, note, devices, target, len(attempts), limit, verdict.capped, fewest
        )
    outcomes = ", ".join(
        f"#{a.index} {a.outcome.outcome if a.outcome else 'cancelled'}" for a in attempts
    )
    last = next((a.outcome for a in reversed(attempts) if a.outcome is not None), None)
    said = ""
    if last is not None:
        first = last.message.splitlines()[0] if last.message else ""
        said = " ".join(part for part in (first, last.stderr_tail[-300:].strip()) if part)
    detail = f"; last: {said}" if said else ""
    raise CompileFailedError(
        f"no plan compiled after {len(attempts)} attempt(s) ({outcomes}){detail}",
        hint="see report.json attempts[] for each outcome; raise attempt_timeout if compiles time out",
    )


def _failure(
    failed: tuple[Failure, int], attempts: Sequence[AttemptRecord], backend: str
) -> SharderdError:
    """The error of a compile that ends the search (``search_state.Failure``)."""
    why, index = failed
    outcome = attempts[index].outcome
    message = outcome.message if outcome is not None else ""
    if why == "verification":
        return VerificationError(message)
    first = message.splitlines()[0] if message else "no message"
    return CompileFailedError(
        f"the {backend} backend rejected the sharded model: {first}",
        hint="see report.json attempts[].message for the full compiler text",
    )


async def _not_proven(
    ooms: list[AttemptRecord],
    settled: NoSplitError | None,
    note: str,
    devices: int,
    target: Target,
    compiles: int,
    max_attempts: int,
    capped: bool,
    fewest: Callable[[], Awaitable[int | None]],
) -> NotProvenError:
    if not ooms and settled is not None:
        return NotProvenError(  # the planner's estimate, before any compile
            settled.message,
            hint=settled.hint,
            reruns=settled.reruns,
            min_devices=settled.min_devices,
        )
    base = (
        f"no fitting split found on {devices} × {target.name} (not proven): "
        f"{compiles} compile(s), {len(ooms)} ran out of memory"
    )
    worst = ooms[-1]
    oom = worst.outcome.oom if worst.outcome else None
    over = _worst_tile(oom, target)
    where = ""
    if oom is not None:
        where = f", last on device {oom.device}{over}"
        if oom.device is None:
            kind = "host-stream memory" if oom.kind == "stream" else "memory"
            where = f", last out of {kind} on a device the compiler did not name"
    if worst.probe_node is not None:
        where = f", last node {worst.probe_node!r} compiled alone on one device{over}"
    if capped:
        why = (
            "; the estimate with the safety margin ruled every split out before any compile, so "
            f"at most {max_attempts} compiles are tried: the split closest to fitting, then one "
            "its overflow left room for"
        )
    elif settled is None:
        why = f"; the compile budget ({max_attempts}) is spent"
    else:
        why = "; no split fits the memory model fitted to these compiles (an estimate: not a proof)"
        if settled.node is not None:
            why += (
                f", under which node {settled.node!r} alone needs {settled.node_need:.2f}× a device"
            )
    min_devices = await fewest()
    more = f" The measurements suggest {min_devices} devices." if min_devices is not None else ""
    hint = (
        f"rerun with --devices {min_devices}"
        if min_devices is not None
        else "no split fits the fitted model on any number of devices the model has nodes for: "
        "reduce the batch or the model, or use a target with more memory"
    )
    return NotProvenError(
        base + where + why + note + "." + more,
        hint=hint,
        reruns=() if min_devices is None else ({"devices": min_devices},),
        device=None if oom is None else oom.device,
        short_bytes=None if settled is None else settled.short_bytes,
        min_devices=min_devices,
    )


def _worst_tile(oom: OomInfo | None, target: Target) -> str:
    if oom is None or oom.bytes_used is None or not target.bytes_per_tile:
        return ""
    return f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or target.bytes_per_tile)})"


async def fewest_devices(
    session: PlanSession, request: Callable[[int], PlanRequest], devices: int
) -> int | None:
    """The fewest devices above ``devices`` on which the model as measured (``request(n)``) has a
    split: the extra devices double until one has (or the model has too few nodes for them), then
    the gap halves back (more devices never lose a split); None when no count has one."""

    async def has_split(n: int) -> bool | None:  # None: more devices than the model has nodes
        try:
            await session.plan(request(n))
        except NoSplitError:
            return False
        except ConfigError:
            return None
        return True

    low, step = devices, 1
    while (found := await has_split(devices + step)) is False:
        low, step = devices + step, step * 2
    high = devices + step  # the first with a split lies in (low, high] if any: halve the gap
    while high - low > 1:
        mid = (low + high) // 2
        if (answer := await has_split(mid)) is False:
            low = mid
        else:  # a split, or past the most devices: the first split is at most mid
            high, found = mid, answer
    return high if found else None
