"""How a finished search ends: the kept plan, a proof that no split fits (exit 3), or "no fitting
split found (not proven)" (exit 5) with what was tried and what the compiles showed."""

from __future__ import annotations

from sharderd.backends.protocol import AttemptOutcome
from sharderd.errors import (
    CompileFailedError,
    ConfigError,
    NoSplitError,
    NotProvenError,
    PlanInfeasibleError,
)
from sharderd.job.attempts import AttemptRecord, ProveResult
from sharderd.job.prover_state import ProverState
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["Verdict", "probe_proof"]

FEWEST_EXTRA = 8
"""How many devices beyond the request the hint of a "not proven" looks for a split on."""


def probe_proof(
    record: AttemptRecord, outcome: AttemptOutcome, devices: int, target: Target
) -> PlanInfeasibleError:
    """Ground (c): one node compiled alone on one device at the lowest AMP ran out of memory."""
    oom = outcome.oom
    worst = ""
    if oom is not None and oom.bytes_used is not None and target.bytes_per_tile:
        worst = f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or target.bytes_per_tile)})"
    error = PlanInfeasibleError(
        f"the model does not fit on {devices} × {target.name}: {record.probe} compiled alone on one "
        f"device at available_memory_proportion {record.key.amp:g} (attempt {record.index}) ran out "
        f"of memory{worst}, and every split holds it on some device, so no number of devices helps",
        grounds="probe",
        hint="reduce batch_size or the op's size, or use a target with more memory",
        device=None if oom is None else oom.device,
    )
    name = record.probe or ""
    error.node = name.removeprefix("node ").strip("'\"") or None
    return error


class Verdict(ProverState):
    async def _result(self) -> ProveResult:
        best = self._best_ok()
        if best is not None:
            return ProveResult(best, tuple(self.attempts))
        if self.fatal is not None:
            raise self.fatal
        if self.proof is not None:
            raise self.proof
        ooms = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "oom"]
        if self.infeasible is not None or ooms:
            raise await self._not_proven(ooms)
        outcomes = ", ".join(
            f"#{a.index} {a.outcome.outcome if a.outcome else 'cancelled'}" for a in self.attempts
        )
        last = next((a.outcome for a in reversed(self.attempts) if a.outcome is not None), None)
        detail = ""
        if last is not None:
            detail = f"; last: {last.message.splitlines()[0] if last.message else ''} {last.stderr_tail[-300:].strip()}"
        raise CompileFailedError(
            f"no plan compiled after {len(self.attempts)} attempt(s) ({outcomes}){detail}",
            hint="see report.json attempts[] for each outcome; raise attempt_timeout if compiles time out",
        )

    async def _not_proven(self, ooms: list[AttemptRecord]) -> NotProvenError:
        """What was tried, what the compiles showed, and the device count they suggest."""
        settled = self.infeasible
        if not ooms and settled is not None:
            return NotProvenError(  # the planner's estimate, before any compile
                settled.message, hint=settled.hint, min_devices=settled.min_devices
            )
        base = (
            f"no fitting split found on {self.devices} × {self.target.name} (not proven): "
            f"{len(self.attempts)} compile(s), {len(ooms)} ran out of memory"
        )
        worst = ooms[-1]
        oom = worst.outcome.oom if worst.outcome else None
        over = ""
        if oom is not None and oom.bytes_used is not None and self.target.bytes_per_tile:
            over = f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or self.target.bytes_per_tile)})"
        where = f", last on device {oom.device}{over}" if oom is not None else ""
        if worst.probe is not None:
            where = f", last {worst.probe} compiled alone on one device{over}"
        if settled is None:
            why = f"; the compile budget ({self.max_attempts}) is spent"
        else:
            why = "; no split fits the memory model fitted to these compiles (an estimate: not a proof)"
            if settled.node is not None:
                why += f", under which node {settled.node!r} alone needs {settled.node_need:.2f}× a device"
        min_devices = await self._fewest_devices()
        more = (
            f" The measurements suggest {min_devices} devices." if min_devices is not None else ""
        )
        hint = (
            f"rerun with --devices {min_devices}"
            if min_devices is not None
            else f"no split fits the fitted model on up to {self.devices + FEWEST_EXTRA} devices either: "
            "reduce the batch or the model, or use a target with more memory"
        )
        return NotProvenError(
            base + where + why + self.settle_note + "." + more,
            hint=hint,
            device=None if oom is None else oom.device,
            short_bytes=None if settled is None else settled.short_bytes,
            min_devices=min_devices,
        )

    async def _fewest_devices(self, extra: int = FEWEST_EXTRA) -> int | None:
        """The fewest devices above the requested count with a split under the measured model."""
        estimate, content = self.state.scales(), self.state.estimate_content()
        for devices in range(self.devices + 1, self.devices + extra + 1):
            scale = (*estimate, *(1.0,) * (devices - self.devices))
            try:
                await self.session.plan(
                    self._request(1.0, scale, None, None, devices, content=content)
                )
            except NoSplitError:
                continue
            except ConfigError:  # more devices than the model has nodes
                break
            return devices
        return None
