"""What to compile next: the plan, a speculative variant, a verdict check, an AMP retry, a
performance variant. The half of the policy that asks the planner; ``plan/search.py`` holds the
pure half (what an outcome teaches)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sharderd.errors import NoSplitError, PlanInfeasibleError
from sharderd.job.attempts import AttemptRecord
from sharderd.job.prover_state import MAX_ESCALATIONS, PERF_BAND, ProverState
from sharderd.job.session import PlanRequest, ProbeRequest
from sharderd.plan.choose import Compiled, best_compiled
from sharderd.plan.memory_model import cautious
from sharderd.plan.search import (
    HEADROOM,
    AttemptKey,
    ContentCorrection,
    Observation,
    StageView,
    amp_closing,
    amp_for_plan,
    amp_retry,
    amp_saving,
    stage_views,
)

__all__ = ["NextAttempt"]


async def _or_none(planned: Awaitable[AttemptRecord | None]) -> AttemptRecord | None:
    """A candidate, or None when its model has no split (a variant, not a verdict)."""
    try:
        return await planned
    except NoSplitError:
        return None


class NextAttempt(ProverState):
    # -- planning --------------------------------------------------------------------------

    def _request(
        self,
        margin: float,
        scale: tuple[float, ...],
        orders: tuple[str, ...] | None,
        write_dir: str | None,
        devices: int | None = None,
        content: ContentCorrection | None = None,
    ) -> PlanRequest:
        # No correction learned yet: say so (None), so the planner returns its least overfull split
        # for a compile to decide instead of refusing without a proof.
        learned = None if all(x == 1.0 for x in scale) else scale
        return PlanRequest(
            devices or self.devices,
            margin,
            learned,
            orders,
            write_dir=write_dir,
            stem=self.stem,
            measured_times=self.measured_times,
            content=None if content is None or content.identity else content,
        )

    async def _plan(
        self,
        *,
        margin: float,
        scale: tuple[float, ...],
        content: ContentCorrection,
        orders: tuple[str, ...] | None,
        amp: float,
    ) -> tuple[dict[str, Any], tuple[float, ...]] | None:
        """A plan whose (digest, amp) was never tried, escalating the last correction if needed."""
        state = self.state
        for _ in range(MAX_ESCALATIONS):
            result = await self.session.plan(
                self._request(margin, scale, orders, None, content=content)
            )
            if AttemptKey(result["plan"]["digest"], amp) not in self.tried:
                self.state = state
                return result, scale
            if orders is not None or margin != self.margin:
                return None  # a variant that reproduces a tried split adds nothing
            state = state.escalate(state.last_oom_device())
            scale = state.scales()
        return None

    async def _candidate(
        self,
        label: str,
        margin: float,
        scale: tuple[float, ...],
        orders: tuple[str, ...] | None,
        amp: float,
        content: ContentCorrection,
    ) -> AttemptRecord | None:
        planned = await self._plan(
            margin=margin, scale=scale, content=content, orders=orders, amp=amp
        )
        if planned is None:
            return None
        _, used_scale = planned
        index = len(self.attempts)
        directory = self._fresh(index)
        request = self._request(margin, used_scale, orders, str(directory), content=content)
        result = await self.session.plan(request)
        record = AttemptRecord(
            index=index,
            label=label,
            key=AttemptKey(result["plan"]["digest"], amp),
            margin=margin,
            scale=used_scale,
            orders=orders,
            plan=result["plan"],
            files=result["files"],
            directory=directory,
            request=request,
            measured_times=self.measured_times,
            contents=result.get("contents", ()),
        )
        self.emit(
            "plan.finished",
            {
                "label": label,
                "digest": record.key.digest,
                "bottleneck_s": record.predicted_s,
                "ratio_to_bound": result["plan"]["ratio_to_bound"],
                "memory_scale": list(used_scale),
            },
        )
        return record

    async def _next(self) -> AttemptRecord | None:
        if self.fatal is not None or self.done or self.proof is not None:
            return None
        if self.calibrate_pending:
            self.calibrate_pending = False
            record = await _or_none(
                self._candidate(
                    "re-plan on measured times",
                    self.margin,
                    self.scale,
                    None,
                    self.default_amp,
                    self.state.content(),
                )
            )
            if record is not None:
                return record
        if self.need_base and self.infeasible is None:
            if self.attempts and self.running:
                # A running compile's outcome may change the re-plan: wait for it (an OOM there
                # is evidence the re-plan should have; a fit ends the search without it).
                return None
            self.need_base = False
            label = "plan" if not self.attempts else "re-plan after OOM"
            try:
                record = await self._candidate(
                    label, self.margin, self.scale, None, self.default_amp, self.state.content()
                )
            except PlanInfeasibleError as proof:
                self.proof = proof  # the weights alone: no compile can change it
                return None
            except NoSplitError as err:
                record = None
                if err.fits_without_margin and self.margin > 1.0 and not self.state.observations:
                    # Only the margin rules it out: the compiler, not the prior, should decide.
                    self.margin = 1.0
                    self.state = replace(self.state, margin=1.0)
                    self.spec_margins = []
                    self.need_base = True
                    return await self._next()
                record = await self._verdict_check(err)
            if record is not None:
                return record
        amp_running = any(a.key.amp != self.default_amp for a in self.running.values())
        if self.infeasible is None and not self._any_ok():
            spec = await self._speculative()
            if spec is not None:
                return spec
        elif self.infeasible is not None and not self.attempts:
            # The estimate rules every split out, which is no proof: the probe, when a node is
            # large enough to be worth it, may make it one (``verdict.probe_proof``).
            return await self._probe()
        if self.optimal_perf and self._any_ok():
            return await self._perf_variant()
        if (
            self.infeasible is not None
            and self.backend == "poprt"
            and not self._any_ok()
            and not amp_running
        ):
            return self._amp_retry()  # one at a time: a higher proportion that compiles runs faster
        return None

    async def _speculative(self) -> AttemptRecord | None:
        """A variant for a free pool slot: a probe of the node most at risk alone; a larger margin
        before any OOM, the systemic guess after."""
        probe = await self._probe()
        if probe is not None:
            return probe
        if self.hypothesis_pending:
            self.hypothesis_pending = False
            guess = self.state.hypothesis()
            if guess is not None:
                record = await _or_none(
                    self._candidate(
                        "speculative: every node as corrected as the worst",
                        self.margin,
                        self.scale,
                        None,
                        self.default_amp,
                        guess,
                    )
                )
                if record is not None:
                    return record
        if self.spec_margins and not self.state.observations:
            margin = self.spec_margins.pop(0)
            record = await _or_none(
                self._candidate(
                    f"speculative margin {margin:g}",
                    margin,
                    self.scale,
                    None,
                    self.default_amp,
                    self.state.content(),
                )
            )
            if record is not None:
                return record
        return None

    def _may_probe(self) -> bool:
        """One probe per job, PopRT only, beside the first plan (before any outcome)."""
        return (
            self.backend == "poprt"
            and not self.state.observations
            and not self._any_ok()
            and not any(a.probe is not None for a in self.attempts)
        )

    async def _probe(self) -> AttemptRecord | None:
        """The node needing most of a device alone, compiled alone at the lowest AMP the config
        allows (``plan.probe``): an overflow there proves no split fits (``errors.GROUNDS``)."""
        if not self._may_probe():
            return None
        index = len(self.attempts)
        result = await self.session.probe(
            ProbeRequest(write_path=str(self._fresh(index) / f"{self.stem}.probe.onnx"))
        )
        found = result["probe"]
        if found is None:
            return None
        self.emit("probe.planned", {"node": found["name"], "need": round(found["need"], 4)})
        plan = result["plan"]
        what = f"node {found['name']!r}"
        return AttemptRecord(
            index=index,
            label=f"probe: {what} alone on one device",
            key=AttemptKey(plan["digest"], self.lowest_amp),
            margin=1.0,
            scale=tuple(plan["memory_scale"]),
            orders=None,
            plan=plan,
            files=result["files"],
            directory=self.workdir / f"attempt-{index}",
            request=None,
            contents=result["contents"],
            probe=what,
        )

    def _fresh(self, index: int) -> Path:
        """The attempt's folder, emptied: a probe writes its model there before it starts."""
        directory = self.workdir / f"attempt-{index}"
        if directory.exists():
            shutil.rmtree(directory)
        return directory

    async def _verdict_check(self, err: NoSplitError) -> AttemptRecord | None:
        """The corrected model has no split: is that true of every model the compiles allow?

        Without any compile the planner's own proof stands. Otherwise plan with the model exactly
        as measured (``SearchState.estimate_content``: no margin, no headroom): no split there settles
        "does not fit"; a split there is compiled, because the verdict would rest on the margin.
        """
        if not self.state.observations:
            self.infeasible = err
            return None
        estimate, content = self.state.scales(), self.state.estimate_content()
        try:
            planned = await self._plan(
                margin=1.0, scale=estimate, content=content, orders=None, amp=self.default_amp
            )
        except NoSplitError as settled:
            self.infeasible = settled
            return None
        if planned is None:  # its split was compiled already and ran out of memory
            self.infeasible = err
            return None
        # Among the splits the measured model allows, prefer one with room on the device that
        # overflowed last: the compiler names the lowest failing device, so a split that only
        # just fits there would likely name it again and teach nothing of the others. Better
        # still, one with room for the nodes no compile measured, whose error the OOM reports
        # could not show.
        roomy = self.state.escalate(self.state.last_oom_device(), HEADROOM).scales()
        room = cautious(content)
        if room is not None:
            record = await _or_none(
                self._candidate(
                    "verdict check: the model as measured, room for unmeasured nodes",
                    1.0,
                    roomy,
                    None,
                    self.default_amp,
                    room,
                )
            )
            if record is not None:
                return record
        try:
            spaced = await self._plan(
                margin=1.0, scale=roomy, content=content, orders=None, amp=self.default_amp
            )
        except NoSplitError:
            spaced = None
        return await self._candidate(
            "verdict check: the model as measured, no margin",
            1.0,
            roomy if spaced is not None else estimate,
            None,
            self.default_amp,
            content,
        )

    def _amp_retry(self) -> AttemptRecord | None:
        """At most one lower ``available_memory_proportion`` per level, and only when its share can close the gap."""
        ooms = [
            (o, a)
            for a in self.attempts
            for o in self.state.observations
            if o.attempt == a.index
            and a.probe is None  # a lower proportion is retried on a plan of the model
            and not o.fits
            and a.outcome is not None
            and a.outcome.outcome == "oom"
        ]
        if not ooms:
            return None
        settled = self.infeasible
        if settled is not None and settled.node is not None:
            # One node alone overflows under the measured model: a lower proportion helps only
            # if what it can take off a tile can close that node's own gap.
            need = settled.node_need
            fallbacks = self.config.search.amp_fallbacks
            if amp_closing(need, self.default_amp, fallbacks) is None:
                if not self.settle_note:
                    lowest = min(fallbacks, default=self.default_amp)
                    self.settle_note = (
                        f"; a lower available_memory_proportion was not tried: {settled.node!r} alone "
                        f"needs {need:.2f}× a device, and a cap on temporaries of {lowest:g} instead "
                        f"of {self.default_amp:g} takes at most "
                        f"{amp_saving(self.default_amp, lowest) * 100:.0f}% of a tile off"
                    )
                return None
        tried_amps = sorted({a.key.amp for _, a in ooms}, reverse=False)
        lowest = tried_amps[0]
        at_lowest = [(o, a) for o, a in ooms if a.key.amp == lowest]
        observation, base = min(
            at_lowest,
            key=lambda pair: pair[0].measured if pair[0].measured is not None else math.inf,
        )
        fallbacks = self.config.search.amp_fallbacks
        if observation.stage is None:
            amp = amp_retry(observation, lowest, fallbacks)
        else:
            views = stage_views(base.plan, self.target.memory_bytes, base.contents)
            amp, stage, need = amp_for_plan(
                views, base.index, self.state.observations, lowest, fallbacks
            )
            if amp is None and stage is not None:
                if not self.settle_note:
                    self.settle_note = self._amp_note(stage, need, lowest, base.index, observation)
                return None
        if amp is None:
            return None
        key = AttemptKey(base.key.digest, amp)
        if key in self.tried:
            return None
        index = len(self.attempts)
        return AttemptRecord(
            index=index,
            label=f"available_memory_proportion {amp:g}",
            key=key,
            margin=base.margin,
            scale=base.scale,
            orders=base.orders,
            plan=base.plan,
            files=base.files,
            directory=base.directory.parent / f"attempt-{index}",
            request=base.request,
            measured_times=base.measured_times,
            contents=base.contents,
        )

    def _amp_note(
        self, stage: StageView, need: float, amp: float, attempt: int, named: Observation
    ) -> str:
        lowest = min(self.config.search.amp_fallbacks, default=amp)
        share = amp_saving(amp, lowest) / need if need else 0.0
        where = f"device {stage.device}'s worst tile"
        if named.device != stage.device:
            # Not what this compile measured: carried over from an overflow of mostly its nodes.
            where = (
                f"device {stage.device}'s worst tile in attempt {attempt} (as an overflow of "
                "mostly the same nodes measured it)"
            )
        return (
            f"; a lower available_memory_proportion was not tried: it caps conv/matmul temporaries per "
            f"tile, and even at {lowest:g} it can take at most {share * 100:.0f}% off {where}, "
            f"the gap is {(need - 1) / need * 100:.0f}%"
        )

    async def _perf_variant(self) -> AttemptRecord | None:
        if self.perf_variants is None:
            margins = sorted(
                {
                    self.margin,
                    self.margin * 1.1,
                    self.margin * 1.25,
                    *self.config.search.speculative_margins,
                }
            )
            self.perf_variants = [
                (m, o) for m in margins for o in (None, ("file",), ("depth_first",))
            ]
        best = self._best_ok()
        assert best is not None
        batch = self.config.plan.batch_size
        periods = {a.index: p for a in self.attempts if (p := a.measured_period_s(batch))}
        if not periods or best.index not in periods:
            return None
        ratio = min(
            periods[a.index] / a.predicted_s
            for a in self.attempts
            if a.index in periods and a.predicted_s > 0
        )
        best_period = periods[best.index]
        while self.perf_variants:
            margin, orders = self.perf_variants.pop(0)
            record = await _or_none(
                self._candidate(
                    "optimal-perf variant",
                    margin,
                    self.state.scales(),
                    orders,
                    self.default_amp,
                    self.state.content(),
                )
            )
            if record is None:
                continue
            if record.predicted_s * ratio * PERF_BAND < best_period:
                return record
            shutil.rmtree(record.directory, ignore_errors=True)
        return None

    def _compiled_plans(self) -> list[AttemptRecord]:
        """Attempts whose plan compiled (a probe's success is no plan)."""
        return [
            a
            for a in self.attempts
            if a.probe is None and a.outcome is not None and a.outcome.outcome == "ok"
        ]

    def _any_ok(self) -> bool:
        return bool(self._compiled_plans())

    def _best_ok(self) -> AttemptRecord | None:
        oks = {a.index: a for a in self._compiled_plans()}
        choice = best_compiled(
            [Compiled(a.index, a.predicted_s, a.throughput) for a in oks.values()],
            by_measurement=self.optimal_perf or self.measured_times is not None,
        )
        return None if choice is None else oks[choice.attempt]
