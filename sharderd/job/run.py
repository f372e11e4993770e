"""One sharding job, start to end: analyse, plan, prove on a backend, write the results.

The CLI's ``shard`` and every daemon job run exactly this (``run_local``: in this process, with
a pool of its own; the daemon runs ``shard_job`` under its own pool and folders). Expected failures raise
``SharderdError`` carrying the partial report (``JobFailed``), so the caller files it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sharderd.backends.ipus import IpuPool
from sharderd.backends.pool import AttemptPool
from sharderd.backends.registry import (
    PROVEN_STATUS,
    AttemptHosts,
    fallback_warnings,
    resolve_backend,
)
from sharderd.config import Config, SearchOptions
from sharderd.errors import ModelInvalidError, NoSplitError, NotProvenError, SharderdError
from sharderd.filenames import text_values
from sharderd.fsutil import atomic_write
from sharderd.job.attempts import Contradiction
from sharderd.job.codec import ModelSummary
from sharderd.job.limits import PlanningLimits
from sharderd.job.outdir import REPORT_FILES, check_model_file
from sharderd.job.planning import fitting_devices, piece_stages
from sharderd.job.prove import Emit, Prover, ProveResult
from sharderd.job.session import (
    LocalSession,
    Planned,
    PlanRequest,
    PlanService,
    PlanSession,
    Serialize,
    WorkerSession,
)
from sharderd.plan.infeasible import fitting_hint
from sharderd.report.assumptions import defaulted_dims
from sharderd.report.attempts import attempt_dict
from sharderd.report.build import (
    as_given,
    plan_section,
    report_dict,
    serialized_section,
    trial_section,
)
from sharderd.report.html import render_html
from sharderd.report.markdown import render_markdown
from sharderd.shard.serialize import Serialized

__all__ = [
    "REPORT_FILES",
    "JobFailed",
    "JobResult",
    "JobSpec",
    "run_local",
    "shard_job",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class JobSpec:
    model: Path
    out_dir: Path
    stem: str
    devices: int
    config: Config
    search: SearchOptions
    """The effective search options, resolved by the caller (``sharderd.config.search_options``)."""
    target: str | None = None
    job_id: str = "cli"
    priority: int = 0
    isolate_planning: bool = False
    """Plan in a child process (the daemon): a huge model never blocks the event loop."""
    max_devices: int | None = None
    """After ``auto_devices`` chose ``devices``: the most it could have used (for the report)."""
    auto_devices: bool = False
    """``devices = "auto"``: ``devices`` is the most the job may use; it runs on the fewest whose
    predicted throughput is within ``plan.fewest.THROUGHPUT_BAND`` of a plan on that many."""
    report_extra: Mapping[str, Any] | None = None
    """Top-level keys the caller adds to report.json, failed or not (the daemon's ``job``)."""
    planning_limits: PlanningLimits | None = None
    """Time and memory the child process may spend (``isolate_planning`` only)."""


@dataclass(frozen=True, slots=True)
class JobResult:
    report: dict[str, Any]
    out_dir: Path
    status: str


class JobFailed(SharderdError):
    """Wraps the job's error with the report written so far."""

    def __init__(self, error: SharderdError, report: dict[str, Any] | None) -> None:
        super().__init__(error.message, hint=error.hint)
        self.error = error
        self.report = report
        self.exit_code = error.exit_code  # type: ignore[misc]
        self.reason = error.reason  # type: ignore[misc]

    def to_dict(self) -> dict[str, object]:
        return self.error.to_dict()


def write_report(report: Mapping[str, Any], out_dir: Path) -> None:
    """report.json is the source; report.md and report.html are its renderings for people."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = text_values(report)  # a path that is not UTF-8 as %XX: every file stays UTF-8
    as_json, as_md, as_html = (out_dir / name for name in REPORT_FILES)
    atomic_write(as_json, json.dumps(report, indent=1) + "\n")
    atomic_write(as_md, render_markdown(report))
    atomic_write(as_html, render_html(report))


async def run_local(spec: JobSpec, *, emit: Emit) -> JobResult:
    """Run ``spec`` with its own attempt pool, in a temporary attempts folder removed after.

    Raises:
        JobFailed: the job's error and its partial report; when there is one (the model was
            read), it is already written to ``spec.out_dir`` with its verdict and any attempts.
    """
    try:
        check_model_file(spec.model)
    except ModelInvalidError as err:
        raise JobFailed(err, None) from None
    pool = AttemptPool(spec.search.parallel, ipus=IpuPool.of_setting(spec.config.poprt.ipus))
    with tempfile.TemporaryDirectory(prefix="sharderd-attempts-") as work:
        try:
            return await shard_job(spec, pool=pool, workdir=Path(work), emit=emit)
        except JobFailed as failed:
            if failed.report is not None:
                write_report(failed.report, spec.out_dir)
            raise


async def shard_job(
    spec: JobSpec,
    *,
    pool: AttemptPool,
    workdir: Path,
    emit: Emit,
    env: Mapping[str, str] | None = None,
    argv_prefix: list[str] | None = None,
) -> JobResult:
    config = spec.config
    target = config.target(spec.target)
    hosts = pool.runner if isinstance(pool.runner, AttemptHosts) else None
    if hosts is not None:
        await hosts.refresh()
    backend = resolve_backend(
        spec.search.backend, target, hosts, fallback=spec.search.auto_fallback
    )
    notes = fallback_warnings(spec.search.backend, backend, target)
    emit(
        "backend.selected",
        {"backend": backend, "requested": spec.search.backend, "target": target.name},
    )
    # the session rewrites nodes into pieces before it analyses (in the plan worker, if any)
    serialize = (
        Serialize(spec.devices, str(workdir / "serialized")) if config.plan.serialize else None
    )
    serialized: tuple[Serialized, ...] = ()
    session: PlanSession
    if spec.isolate_planning:
        try:
            session = await WorkerSession.start(
                spec.model,
                config.plan,
                target,
                stderr_path=workdir / "planworker.stderr",
                env=env,
                serialize=serialize,
                limits=spec.planning_limits,
            )
        except OSError as exc:
            raise JobFailed(
                SharderdError(f"cannot start the planning worker: {exc}"), None
            ) from None
    else:
        session = LocalSession(PlanService(spec.model, config.plan, target, serialize))
    summary: ModelSummary | None = None
    attempts: list[dict[str, Any]] = []
    stage_amps: tuple[float, ...] | None = None  # each stage's AMP as compiled (PopRT only)
    serialized_matmuls: tuple[tuple[str, int], ...] = ()  # PopART's matmul serialization
    contradiction: Contradiction | None = None  # a probe's proof the kept compile refuted

    def partial(
        status: str, error: SharderdError, plan: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        if summary is None:
            return None
        return report_dict(
            model=summary.facts,
            warnings=_warnings(notes, summary, config),
            target=target,
            plan=plan,
            batch_size=config.plan.batch_size,
            status=status,
            backend=backend,
            attempts=attempts,
            error=error.to_dict(),
            extra=spec.report_extra,
        )

    try:
        emit(
            "plan.started",
            {"model": str(spec.model), "devices": spec.devices, "target": target.name},
        )
        summary = await session.summary()
        if spec.auto_devices:
            spec = await _choose_devices(session, spec, emit)
        serialized = summary.serialized
        if serialized:
            summary = replace(summary, facts=as_given(dict(summary.facts), spec.model))
        if backend == "none":
            request = PlanRequest(
                spec.devices,
                config.plan.safety_margin,
                stem=spec.stem,
                max_devices=spec.max_devices,
            )
            planned = await session.plan(request)
            if planned.plan.method == "overfull":
                fits_on, last = await fitting_devices(session, request, int(summary.facts["nodes"]))
                hint, reruns = fitting_hint(spec.devices, fits_on, last)
                raise NotProvenError(
                    f"no fitting split found on {spec.devices} × {target.name} (not proven): the "
                    "least overfull split the order search found overflows the estimate, no estimate "
                    "rules every split out, and backend none compiles nothing",
                    hint=hint,
                    reruns=reruns,
                    min_devices=fits_on,
                )
            final = await session.plan(
                replace(request, write_dir=str(spec.out_dir), link_external=False, fewest=True)
            )
            emit(
                "plan.finished",
                {"digest": final.plan.digest, "bottleneck_s": final.plan.bottleneck_s},
            )
            status, extra = PROVEN_STATUS[backend], {}
        else:
            workdir.mkdir(parents=True, exist_ok=True)
            prover = Prover(
                session=session,
                model=spec.model,
                stem=spec.stem,
                devices=spec.devices,
                config=config,
                search=spec.search,
                job_id=spec.job_id,
                priority=spec.priority,
                max_devices=spec.max_devices,
                summary=summary,
                backend=backend,
                target=target,
                workdir=workdir,
                pool=pool,
                emit=emit,
                env=env,
                argv_prefix=argv_prefix,
            )
            try:
                proven = await prover.run()
            finally:
                attempts = [attempt_dict(a) for a in prover.attempts]
            final = await _write_chosen(session, spec, proven)
            status, extra = PROVEN_STATUS[backend], _extra(proven)
            contradiction = proven.contradiction
            if backend == "poprt":
                chosen = proven.chosen
                stage_amps = chosen.key.stage_amps or (chosen.key.amp,) * final.plan.devices
                serialized_matmuls = chosen.key.serialize
    except NoSplitError as err:
        raise JobFailed(err, partial(err.reason, err)) from None
    except JobFailed:
        raise
    except SharderdError as err:
        raise JobFailed(err, partial("failed", err)) from None
    finally:
        await session.aclose()

    assert final.files is not None
    outputs = {
        "model": final.files.model.name,
        "sharding_config": final.files.sharding_yaml.name,
        "external_data": [str(p.relative_to(spec.out_dir)) for p in final.files.external],
        "report_json": "report.json",
        "report_md": "report.md",
        "report_html": "report.html",
        **extra.pop("outputs", {}),
    }
    if serialized:
        stages = piece_stages(final.files.model)
        extra["serialized"] = serialized_section(serialized, stages)
    if summary.trial is not None:
        extra["serialization_tried"] = trial_section(summary.trial)
    report = report_dict(
        model=summary.facts,
        warnings=_warnings(notes, summary, config),
        target=target,
        plan=plan_section(
            final.plan, config.plan.batch_size, final.files.routed, stage_amps, serialized_matmuls
        ),
        batch_size=config.plan.batch_size,
        status=status,
        backend=backend,
        attempts=attempts,
        outputs=outputs,
        timings_s={"load_and_analyze": summary.analyze_s},
        extra={**(spec.report_extra or {}), **extra},
        contradiction=None
        if contradiction is None
        else {
            "probe_attempt": contradiction.probe,
            "fitted_attempt": contradiction.fitted,
            "proof": contradiction.proof,
        },
    )
    write_report(report, spec.out_dir)
    return JobResult(report, spec.out_dir, status)


async def _write_chosen(session: PlanSession, spec: JobSpec, proven: ProveResult) -> Planned:
    """Write the compiled plan's files for keeps (external data copied, not linked)."""
    chosen = proven.chosen
    assert chosen.request is not None, "a probe is never the chosen attempt"
    final = await session.plan(
        replace(
            chosen.request,
            write_dir=str(spec.out_dir),
            stem=spec.stem,
            link_external=False,
            fewest=True,
        )
    )
    if final.plan.digest != chosen.key.digest:  # the planner is deterministic; this is a bug
        raise SharderdError("internal error: re-planning the compiled split gave a different split")
    outcome = chosen.outcome
    artifact = Path(outcome.artifact) if outcome is not None and outcome.artifact else None
    if artifact is not None and artifact.is_file():
        shutil.copyfile(artifact, spec.out_dir / artifact.name)
    elif artifact is not None and artifact.is_dir():  # onnxruntime's per-stage models
        shutil.copytree(artifact, spec.out_dir / artifact.name, dirs_exist_ok=True)
    return final


def _warnings(notes: list[str], summary: ModelSummary, config: Config) -> list[str]:
    """What the run assumed (the backend's fallback, dims given no value) before the analysis's."""
    assumed = defaulted_dims(summary.facts["inputs"], config)
    return [*notes, *assumed, *summary.warnings]


def _extra(proven: ProveResult) -> dict[str, Any]:
    chosen = proven.chosen
    outcome = chosen.outcome
    extra: dict[str, Any] = {"chosen_attempt": chosen.index, "compiles": len(proven.attempts)}
    if outcome is not None:
        if outcome.artifact and Path(outcome.artifact).exists():
            extra["outputs"] = {"compiled": Path(outcome.artifact).name}
        if outcome.benchmark is not None:
            extra["benchmark"] = outcome.benchmark.to_dict()
        if outcome.details and "verification" in outcome.details:
            extra["verification"] = outcome.details["verification"]
    return extra


async def _choose_devices(session: PlanSession, spec: JobSpec, emit: Emit) -> JobSpec:
    """``devices = "auto"``: plan on the most devices allowed and take the fewest that keep that
    plan's predicted throughput (``Plan.fewest_devices``; the most when none is known)."""
    widest = await session.plan(
        PlanRequest(spec.devices, spec.config.plan.safety_margin, fewest=True)
    )
    chosen = widest.plan.fewest_devices or spec.devices
    emit(
        "plan.devices_chosen",
        {
            "devices": chosen,
            "max_devices": spec.devices,
            "bottleneck_s": widest.plan.bottleneck_s,
            "fewest_bottleneck_s": widest.plan.fewest_bottleneck_s,
        },
    )
    return replace(spec, devices=chosen, max_devices=spec.devices, auto_devices=False)
