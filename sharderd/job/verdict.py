"""How a finished search ends: the kept plan, or an error that says what the compiles showed."""

from __future__ import annotations

from sharderd.errors import (
    CompileFailedError,
    PlanInfeasibleError,
)
from sharderd.job.attempts import AttemptRecord, ProveResult
from sharderd.job.prover_state import ProverState
from sharderd.units import fmt_bytes

__all__ = ["Verdict"]

FEWEST_EXTRA = 8
"""How many devices beyond the request a "does not fit" looks for a split on."""


class Verdict(ProverState):
    async def _result(self) -> ProveResult:
        best = self._best_ok()
        if best is not None:
            return ProveResult(best, tuple(self.attempts))
        if self.fatal is not None:
            raise self.fatal
        ooms = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "oom"]
        if self.infeasible is not None:
            raise await self._does_not_fit(ooms)
        if ooms:
            raise CompileFailedError(
                f"no plan fitted in {len(self.attempts)} compile(s) on {self.devices} × {self.target.name} "
                f"({len(ooms)} ran out of memory); the corrected model still allows splits, so this is not "
                "a proof that the model does not fit",
                hint=f"rerun with --max-attempts {self.max_attempts * 2} or --devices {self.devices + 1}",
            )
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

    async def _does_not_fit(self, ooms: list[AttemptRecord]) -> PlanInfeasibleError:
        """The settled verdict, from the model that settled it: never a count that contradicts it."""
        assert self.infeasible is not None
        if not ooms:
            return self.infeasible  # the planner's own proof, before any compile
        worst = ooms[-1]
        oom = worst.outcome.oom if worst.outcome else None
        device = oom.device if oom else None
        over = ""
        if oom is not None and oom.bytes_used is not None and self.target.bytes_per_tile:
            over = f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or self.target.bytes_per_tile)})"
        base = f"the model does not fit on {self.devices} × {self.target.name}: {len(ooms)} compile(s) ran out of memory"
        where = f", last on device {device}{over}" if device is not None else ""
        if worst.probe is not None:
            where = f", last {worst.probe} compiled alone on one device{over}"
        settled = self.infeasible
        short = ""
        if (
            settled.device is not None
            and settled.short_bytes is not None
            and settled.short_bytes > 0
        ):
            short = f": device {settled.device} would be short by {fmt_bytes(settled.short_bytes)}"
        why = (
            "; no split fits the memory model that reproduces every compile, even without a safety margin"
            + short
        )
        if settled.node is not None:  # no number of devices helps: do not look for one
            probed = next((a for a in ooms if a.probe == f"node {settled.node!r}"), None)
            alone = (
                f" (compiled alone on one device in attempt {probed.index}, it ran out of memory)"
                if probed is not None and probed is not worst
                else ""
            )
            why += (
                f": node {settled.node!r} alone needs {settled.node_need:.2f}× a device under it"
                f"{alone}, so no number of devices helps"
            )
            min_devices, more, hint = None, "", settled.hint
        else:
            min_devices = await self._fewest_devices()
            more = (
                f" Under that correction {min_devices} devices have a split." if min_devices else ""
            )
            hint = (
                f"rerun with --devices {min_devices}"
                if min_devices
                else f"no split fits that model on up to {self.devices + FEWEST_EXTRA} devices either: "
                "reduce the batch or the model, or use a target with more memory"
            )
        return PlanInfeasibleError(
            base + where + why + self.settle_note + "." + more,
            hint=hint,
            device=device,
            short_bytes=settled.short_bytes,
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
            except PlanInfeasibleError:
                continue
            return devices
        return None
