"""One sharding job, start to end: analyse, plan, prove on a backend, write the results.

The CLI's ``shard`` and every daemon job run exactly this. Expected failures raise
``SharderdError`` carrying the partial report (``JobFailed``), so the caller files it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from sharderd.backends.pool import AttemptPool
from sharderd.backends.registry import AttemptHosts, resolve_backend
from sharderd.config import Config, SearchOptions
from sharderd.errors import NoSplitError, NotProvenError, SharderdError
from sharderd.fsutil import atomic_write
from sharderd.job.codec import ModelSummary
from sharderd.job.limits import PlanningLimits
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
from sharderd.report.attempts import attempt_dict
from sharderd.report.build import as_given, plan_section, report_dict, serialized_section
from sharderd.report.html import render_html
from sharderd.report.markdown import render_markdown
from sharderd.shard.serialize import Serialized

__all__ = ["JobFailed", "JobResult", "JobSpec", "shard_job", "write_report"]


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
    atomic_write(out_dir / "report.json", json.dumps(report, indent=1) + "\n")
    atomic_write(out_dir / "report.md", render_markdown(report))
    atomic_write(out_dir / "report.html", render_html(report))


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
    backend = resolve_backend(spec.search.backend, target, hosts)
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

    def partial(
        status: str, error: SharderdError, plan: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        if summary is None:
            return None
        return report_dict(
            model=summary.facts,
            warnings=list(summary.warnings),
            target=target,
            plan=plan,
            batch_size=config.plan.batch_size,
            status=status,
            backend=backend,
            attempts=attempts,
            error=error.to_dict(),
        )

    try:
        emit(
            "plan.started",
            {"model": str(spec.model), "devices": spec.devices, "target": target.name},
        )
        summary = await session.summary()
        serialized = summary.serialized
        if serialized:
            summary = replace(summary, facts=as_given(dict(summary.facts), spec.model))
        if backend == "none":
            request = PlanRequest(spec.devices, config.plan.safety_margin, stem=spec.stem)
            planned = await session.plan(request)
            if planned.plan.method == "overfull":
                raise NotProvenError(
                    f"no fitting split found on {spec.devices} × {target.name} (not proven): the "
                    "least overfull split the order search found overflows the estimate, no estimate "
                    "rules every split out, and backend none compiles nothing",
                    hint=f"rerun with --devices {spec.devices + 1}, or with a compile backend to let "
                    "the compiler decide",
                )
            final = await session.plan(
                replace(request, write_dir=str(spec.out_dir), link_external=False)
            )
            emit(
                "plan.finished",
                {"digest": final.plan.digest, "bottleneck_s": final.plan.bottleneck_s},
            )
            status, extra = "not_compiled", {}
        else:
            workdir.mkdir(parents=True, exist_ok=True)
            prover = Prover(
                session=session,
                spec=spec,
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
            status, extra = "compiled", _extra(proven)
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
    report = report_dict(
        model=summary.facts,
        warnings=list(summary.warnings),
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
        extra=extra,
    )
    write_report(report, spec.out_dir)
    return JobResult(report, spec.out_dir, status)


async def _write_chosen(session: PlanSession, spec: JobSpec, proven: ProveResult) -> Planned:
    """Write the compiled plan's files for keeps (external data copied, not linked)."""
    chosen = proven.chosen
    assert chosen.request is not None, "a probe is never the chosen attempt"
    final = await session.plan(
        replace(chosen.request, write_dir=str(spec.out_dir), stem=spec.stem, link_external=False)
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


def piece_stages(model_path: Path) -> dict[str, int]:
    """Node name → ``__pipeline_stage`` of the written model (read without its weights)."""
    model = onnx.load(model_path, load_external_data=False)
    return {
        n.name: a.i for n in model.graph.node for a in n.attribute if a.name == "__pipeline_stage"
    }


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
