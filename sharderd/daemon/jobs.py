"""One claimed job, from ``processing/<job_id>/`` to a published result or a ``failed/`` folder.

The order of durable steps is what makes a restart safe (``journal.recover`` reads it back):
success is *publish → journal "succeeded" → input to done/*; failure is *journal "failed" →
``fail_job``*; a duplicate is *journal "duplicate" → input to done/*. A crash between any two steps
leaves a state recovery finishes without running the job again. ``attempts`` is bumped before every
run of the planning worker, so a job whose worker (or the whole daemon) keeps dying stops at
``max_attempts`` across restarts. A shutdown that cancels a job is not a crash: its count is
given back and the job stays in ``processing/`` for the next start. A cancel *request* (the job's
``JobProgress.cancel_requested`` set before its scope is cancelled) ends the job instead: its
attempts are dead by the time the cancellation reaches ``run_job``, and it is filed under
``failed/`` with reason ``cancelled`` (journal state ``cancelled``).

Failures are values here: an expected one (``SharderdError``) and an unexpected one (a bug) both
end the one job in ``failed/`` with ``error.json`` and ``error.md``; only cancellation propagates.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, final

import anyio
import anyio.lowlevel
import structlog

from sharderd.backends.pool import AttemptPool
from sharderd.cluster.errors import AttemptLostError
from sharderd.config import Config, search_options
from sharderd.daemon.intake import ClaimedJob, inspect_entry, is_staging_name
from sharderd.daemon.journal import IndexEntry, JobRecord, JobState, Journal, RecoveredJob
from sharderd.daemon.outbox import (
    JOB_MARKER,
    TMP_PREFIX,
    DaemonDirs,
    fail_job,
    find_published,
    publish,
    rename_unique,
    tmp_dir_for,
)
from sharderd.daemon.sidecar import JobOptions, load_sidecar
from sharderd.daemon.status import JobProgress, StatusBoard
from sharderd.errors import ConfigError, SharderdError
from sharderd.job.run import JobFailed, JobResult, JobSpec, shard_job, write_report
from sharderd.logs import get_logger
from sharderd.report.duplicate import duplicate_report, write_duplicate
from sharderd.target import BUILTIN_TARGETS

__all__ = [
    "WORK_DIR",
    "BadJobError",
    "InternalError",
    "JobCancelledError",
    "JobContext",
    "StorageError",
    "WorkerCrashedError",
    "cancel_claimed",
    "content_key",
    "fail_claimed",
    "finish_recovered",
    "mark_lost",
    "reclaim",
    "run_job",
]

WORK_DIR: Final = ".work"
"""Attempt files inside ``processing/<job_id>/``; a dotfile so no job name can collide with it."""
_CHUNK: Final = 1 << 20
_REPORTS: Final = ("report.json", "report.md", "report.html")
_WORKER_DIED: Final = re.compile(r"the planning worker died \(exit status (-?\d+)\)")
"""How ``WorkerSession`` reports a dead worker (a plain ``SharderdError``); see ``_death_signal``."""

_log = get_logger(__name__)


class BadJobError(SharderdError):
    """The inbox entry can never be a job (two models in a folder, a link, an unreadable folder)."""

    reason = "bad_job"


class WorkerCrashedError(SharderdError):
    """The planning worker, or the daemon itself, died during every run the job was allowed."""

    reason = "worker_crashed"


class JobCancelledError(SharderdError):
    """Someone asked for the job to stop (``sharderd cancel``, ``inbox/<name>.cancel``)."""

    reason = "cancelled"


class InternalError(SharderdError):
    """A bug in sharderd ended the job; the daemon log has the traceback."""

    reason = "internal_error"


class StorageError(SharderdError):
    """The daemon could not read or write the job's files (disk full, permissions): not a bug."""

    reason = "storage"


@dataclass(frozen=True, slots=True)
class JobContext:
    """What every job of one daemon shares."""

    config: Config
    dirs: DaemonDirs
    journal: Journal
    pool: AttemptPool
    board: StatusBoard
    env: Mapping[str, str]
    """Environment of planning workers and attempts (``notify.child_env()``)."""
    inflight: dict[str, anyio.Event] = field(default_factory=dict)
    """Content keys being computed now: a second job with the same key waits, then is a duplicate."""


async def run_job(job: ClaimedJob, ctx: JobContext, progress: JobProgress) -> JobState:
    """Run ``job`` to a terminal state and return it; cancellation leaves it for the next start."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        run = _JobRun(job, ctx, progress)
        try:
            return await run.run()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if progress.cancel_requested is None:
                    run.interrupted()
                else:
                    run.cancelled(progress.cancel_requested)
            raise
        except OSError as exc:  # disk full, permissions; if filing it fails too, the daemon retries
            return run.fail(_storage_error(exc), None)
        except Exception as exc:  # a bug must cost this job, never the daemon
            return run.fail(_internal_error(exc), None, exc_info=exc)


def fail_claimed(job: ClaimedJob, ctx: JobContext, error: SharderdError) -> JobState:
    """File ``job`` under ``failed/`` without running it (recovery: attempts used up)."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        return _JobRun(job, ctx, JobProgress(job.job_id, job.name)).fail(error, None)


def cancel_claimed(job: ClaimedJob, ctx: JobContext, by: str) -> JobState:
    """File a claimed job that never ran (pending when the request came) as cancelled."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        return _JobRun(job, ctx, JobProgress(job.job_id, job.name)).cancelled(by)


def reclaim(found: RecoveredJob) -> ClaimedJob:
    """Rebuild the ``ClaimedJob`` of a folder left in ``processing/`` by an earlier run."""
    job_dir = found.job_dir
    # An interrupted attempt's hard links to the job's data would look like links made by a dropper.
    shutil.rmtree(job_dir / WORK_DIR, ignore_errors=True)
    entries = [p.name for p in sorted(job_dir.iterdir()) if not _is_bookkeeping(p.name)]
    candidates = [c for c in (inspect_entry(job_dir, e) for e in entries) if c is not None]
    if len(candidates) == 1:
        c = candidates[0]
        return ClaimedJob(found.job_id, c.name, c.kind, job_dir, c.path, c.model, c.sidecar, c.problem)
    problem = (f"processing/{found.job_id} holds no model any more" if not candidates else
               f"processing/{found.job_id} holds {len(candidates)} inputs ({', '.join(c.path.name for c in candidates)})")
    return ClaimedJob(found.job_id, found.name, "dir", job_dir, job_dir, None, None, problem)


def finish_recovered(found: RecoveredJob, ctx: JobContext) -> JobState:
    """Complete the bookkeeping of a job whose outcome was decided before the daemon stopped."""
    with structlog.contextvars.bound_contextvars(job_id=found.job_id):
        record = found.record or JobRecord(found.job_id, found.name, state="claimed")
        run = _JobRun(reclaim(found), ctx, JobProgress(found.job_id, found.name))
        if found.result is not None and not record.terminal:
            ctx.journal.record(replace(record, state="succeeded", result=str(found.result)))
            if record.sha256:
                ctx.journal.remember(record.sha256, found.result, found.job_id)
            _log.info("job.succeeded", name=found.name, result=str(found.result), recovered=True)
            run.retire_input(found.result)
            return "succeeded"
        if record.state == "duplicate" and record.result:
            run.retire_input(run.publish_pointer(_marker(Path(record.result)), Path(record.result)))
            return record.state
        if record.state in ("succeeded", "duplicate"):
            run.retire_input(Path(record.result) if record.result else None)
            return record.state
        error = dict(record.error or {"reason": "error", "message": "the job failed before sharderd restarted"})
        return run.fail(error, None)


def mark_lost(record: JobRecord, journal: Journal) -> None:
    """A journal entry whose ``processing/`` folder is gone: nothing can run it, so it failed."""
    error = {"reason": "lost", "message": f"processing/{record.job_id} vanished while the job was {record.state}",
             "hint": None, "exit_code": 1}
    journal.record(replace(record, state="failed", error=error))
    _log.warning("job.failed", job_id=record.job_id, name=record.name, reason="lost", message=error["message"])


async def content_key(job: ClaimedJob, options: Mapping[str, Any]) -> str:
    """sha256 over the job's input bytes and the options that shape its result, not its name.

    Read in 1 MiB chunks with a checkpoint between them: hashing a huge model must not stall the
    event loop (the watchdog, other jobs).
    """
    digest = hashlib.sha256(b"sharderd-content/1\n")
    digest.update(json.dumps(options, sort_keys=True, default=str).encode() + b"\n")
    for rel, path in _content_files(job):
        digest.update(f"{rel}\0".encode())
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                await anyio.lowlevel.checkpoint()
        digest.update(b"\0")
    return digest.hexdigest()


def _content_files(job: ClaimedJob) -> Iterator[tuple[str, Path]]:
    """The model (file job), or every regular file in the folder but its sidecar (folder job)."""
    if job.kind == "file":
        assert job.model is not None
        yield "model.onnx", job.model
        return
    for dirpath, dirnames, filenames in os.walk(job.entry):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path == job.sidecar or not stat.S_ISREG(path.lstat().st_mode):
                continue
            yield path.relative_to(job.entry).as_posix(), path


def _marker(result: Path) -> str:
    """The job id a published result was made by (its ``.sharderd-job``), or ``unknown``."""
    try:
        return (result / JOB_MARKER).read_text(encoding="utf-8").strip() or "unknown"
    except OSError:
        return "unknown"


def _is_bookkeeping(entry: str) -> bool:
    return (is_staging_name(entry) or entry.endswith(".toml")
            or entry in {*_REPORTS, "error.json", "error.md"})


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (anyio task groups always wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _death_signal(error: SharderdError) -> int | None:
    """The signal that killed the planning worker (OOM killer, segfault), else None.

    A worker that exits with a status ran into a Python error that will recur; one killed by a
    signal may have been a victim of memory pressure, so its job is run again.
    """
    match = _WORKER_DIED.match(error.message) if type(error) is SharderdError else None
    code = int(match.group(1)) if match else 0
    return -code if code < 0 else None


def _storage_error(exc: OSError) -> StorageError:
    where = f" ({exc.filename})" if exc.filename else ""
    return StorageError(
        f"sharderd could not read or write this job's files: {exc.strerror or exc}{where}",
        hint="Free disk space or give the sharderd user access to that folder (inbox, outbox and "
             "state_dir must stay writable), then move the input back into the inbox.",
    )


def _internal_error(exc: BaseException) -> InternalError:
    return InternalError(
        f"internal error: {type(exc).__name__}: {exc}",
        hint="This is a bug in sharderd. The daemon log has the traceback (search it for this job id); "
             "please report it with that traceback attached.",
    )


@final
class _JobRun:
    """One run of one job; owned by its task, so plainly mutable."""

    def __init__(self, job: ClaimedJob, ctx: JobContext, progress: JobProgress) -> None:
        self.job = job
        self.ctx = ctx
        self.progress = progress
        self.work_root = job.job_dir / WORK_DIR
        self.work = self.work_root
        self.out = ctx.dirs.outbox / f"{TMP_PREFIX}{job.job_id}"
        self.started = time.monotonic()
        self.record = ctx.journal.get(job.job_id) or JobRecord(job.job_id, job.name)
        self.bumped = False

    async def run(self) -> JobState:
        job, journal = self.job, self.ctx.journal
        self.record = journal.record(replace(self.record, name=job.name, state="claimed"))
        if job.problem is not None or job.model is None:
            return self.fail(BadJobError(job.problem or "the job holds no model"), None)
        try:
            options = self._options()
            effective = self._effective(options)
        except ConfigError as err:
            return self.fail(err, None)
        self.progress.priority = options.priority
        self.progress.stage = "hashing"
        self.ctx.board.changed()
        key = await content_key(job, effective)
        self.record = journal.record(replace(self.record, sha256=key, priority=options.priority,
                                             max_attempts=options.max_attempts))
        async with self._exclusive(key):
            original = journal.lookup(key)
            if original is not None and original.job_id != job.job_id:
                return self._duplicate(original)
            try:
                result = await self._shard(options)
            except Exception as exc:
                leaf = _leaf(exc)
                if isinstance(leaf, JobFailed):
                    return self.fail(leaf.error, leaf.report)
                if isinstance(leaf, SharderdError):
                    return self.fail(leaf, None)
                raise
            return self._succeed(key, result)

    def _options(self) -> JobOptions:
        config = self.ctx.config
        return load_sidecar(self.job.sidecar, config.daemon, optimal_perf=config.search.optimal_perf,
                            known_targets={*config.custom_targets, *BUILTIN_TARGETS})

    def _effective(self, options: JobOptions) -> dict[str, Any]:
        """Every option that changes the result; priority and limits do not."""
        config = self.ctx.config
        return {
            "devices": options.devices,
            "target": asdict(config.target(options.target)),
            "backend": options.backend,
            "optimal_perf": options.optimal_perf,
            "plan": _plain(asdict(options.plan_config(config.plan))),
            "poprt": asdict(config.poprt),
            "onnxruntime": asdict(config.onnxruntime),
            "fallbacks": [config.search.amp_fallbacks, config.search.speculative_margins],
        }

    @contextlib.asynccontextmanager
    async def _exclusive(self, key: str) -> AsyncIterator[None]:
        inflight = self.ctx.inflight
        while (busy := inflight.get(key)) is not None:
            self.progress.stage = "waiting for a job with the same content"
            self.ctx.board.changed()
            await busy.wait()
        done = inflight[key] = anyio.Event()
        try:
            yield
        finally:
            del inflight[key]
            done.set()

    async def _shard(self, options: JobOptions) -> JobResult:
        """Run ``shard_job``, again after a worker killed by a signal, up to ``max_attempts`` runs."""
        job, ctx = self.job, self.ctx
        assert job.model is not None
        config = replace(ctx.config, plan=options.plan_config(ctx.config.plan))
        search = search_options(config, daemon=True, backend=options.backend,
                                optimal_perf=options.optimal_perf, max_attempts=options.max_attempts)
        spec = JobSpec(
            model=job.model, out_dir=self.out, stem=job.model.name.removesuffix(".onnx"),
            devices=options.devices, config=config, search=search, target=options.target,
            job_id=job.job_id, priority=options.priority, isolate_planning=True,
        )
        self.record = ctx.journal.record(replace(self.record, state="planning"))
        while True:
            if self.record.attempts >= options.max_attempts:
                raise WorkerCrashedError(
                    f"the planning worker (or sharderd itself) died in each of {self.record.attempts} runs "
                    f"(max_attempts = {options.max_attempts})",
                    hint="It was killed by a signal each time, most often the kernel's OOM killer: check "
                         "`journalctl -k` for it, give the host more memory, or raise MemoryMax for the service.")
            self.record = ctx.journal.bump_attempts(job.job_id)
            self.bumped = True
            self._reset_dirs()
            try:
                result = await shard_job(spec, pool=ctx.pool, workdir=self.work, emit=self._emit, env=ctx.env)
            except Exception as exc:
                self.bumped = False
                leaf = _leaf(exc)
                error = leaf.error if isinstance(leaf, JobFailed) else leaf
                signum = _death_signal(error) if isinstance(error, SharderdError) else None
                lost = isinstance(error, AttemptLostError)  # a cluster node died: a new try, like a signal
                if signum is None and not lost:
                    raise
                if self.record.attempts >= options.max_attempts:
                    continue  # the check above ends the job
                _log.warning("job.retried", reason="attempt_lost" if lost else "worker_crashed", signal=signum,
                             message=error.message,
                             attempts=self.record.attempts, max_attempts=options.max_attempts)
                continue
            self.bumped = False
            return result

    def _reset_dirs(self) -> None:
        """Fresh folders for this run; the work folder is named by the run, so an attempt orphaned
        by a killed daemon can never leave a result where this run looks for one."""
        shutil.rmtree(self.work_root, ignore_errors=True)
        shutil.rmtree(self.out, ignore_errors=True)
        self.work = self.work_root / f"run-{self.record.attempts}"
        self.work.mkdir(parents=True)
        tmp_dir_for(self.ctx.dirs.outbox, self.job.job_id)

    def _emit(self, event: str, fields: Mapping[str, Any]) -> None:
        p = self.progress
        if event == "plan.started":
            p.stage = "planning"
        elif event == "attempt.started":
            if p.stage != "compiling":
                self.record = self.ctx.journal.record(replace(self.record, state="compiling"))
            p.stage = "compiling"
            p.attempts += 1
            p.attempts_running += 1
        elif event == "attempt.finished":
            self.ctx.board.attempt_finished(p, str(fields.get("result")), float(fields.get("duration_s") or 0.0))
        self.ctx.board.changed()
        _log.info(event, **fields)

    def _succeed(self, key: str, result: JobResult) -> JobState:
        self.progress.stage = "publishing"
        self.progress.attempts_running = 0
        daemon = self.ctx.config.daemon
        shutil.rmtree(self.work_root, ignore_errors=True)
        published = publish(self.out, self.ctx.dirs.outbox, self.job.name,
                            file_mode=daemon.file_mode, dir_mode=daemon.dir_mode)
        self.record = self.ctx.journal.record(replace(self.record, state="succeeded", result=str(published)))
        self.ctx.journal.remember(key, published, self.job.job_id)
        _log.info("job.succeeded", name=self.job.name, result=str(published), status=result.status,
                  compiles=len(result.report.get("attempts", [])), duration_s=self._duration())
        self.retire_input(published)
        return "succeeded"

    def _duplicate(self, original: IndexEntry) -> JobState:
        """Journal it, then give the submitter ``outbox/<name>/`` saying whose result it is, then retire."""
        self.record = self.ctx.journal.record(replace(self.record, state="duplicate", result=original.result))
        pointer = self.publish_pointer(original.job_id, Path(original.result))
        _log.info("job.duplicate", name=self.job.name, original_job_id=original.job_id, result=original.result,
                  outbox=str(pointer))
        self.retire_input(pointer)
        return "duplicate"

    def publish_pointer(self, original_job_id: str, original: Path) -> Path:
        """``outbox/<name>/`` of a duplicate: its reports and ``duplicate.json`` point at ``original``."""
        outbox, daemon = self.ctx.dirs.outbox, self.ctx.config.daemon
        found = find_published(outbox, self.job.name, self.job.job_id)
        if found is not None:  # published before a crash
            return found
        shutil.rmtree(self.out, ignore_errors=True)
        tmp = tmp_dir_for(outbox, self.job.job_id)
        write_duplicate(duplicate_report(name=self.job.name, job_id=self.job.job_id, sha256=self.record.sha256 or "",
                                         original_job_id=original_job_id, original_result=original), tmp)
        return publish(tmp, outbox, self.job.name, file_mode=daemon.file_mode, dir_mode=daemon.dir_mode)

    def fail(self, error: SharderdError | Mapping[str, Any], report: Mapping[str, Any] | None, *,
             exc_info: BaseException | None = None) -> JobState:
        """Journal the failure, then move the job to ``failed/<name>`` with ``error.json``/``error.md``."""
        info = dict(error.to_dict() if isinstance(error, SharderdError) else error)
        failed = self._file_failure(info, report, "failed")
        _log.error("job.failed", name=self.job.name, reason=info.get("reason"), message=info.get("message"),
                   failed=str(failed), duration_s=self._duration(), exc_info=exc_info)
        return "failed"

    def cancelled(self, by: str) -> JobState:
        """Cancelled on request (its attempts are dead by now): file it under ``failed/``."""
        error = JobCancelledError(
            f"cancelled on request ({by})",
            hint="Nothing is wrong with the input; the retry command below runs it again.")
        failed = self._file_failure(error.to_dict(), None, "cancelled")
        self.ctx.pool.forget(self.job.job_id)
        _log.warning("job.cancelled", name=self.job.name, reason="requested", by=by, failed=str(failed),
                     duration_s=self._duration())
        return "cancelled"

    def _file_failure(self, info: dict[str, Any], report: Mapping[str, Any] | None, state: JobState) -> Path:
        """Journal ``state``, then move the job to ``failed/<name>`` with ``error.json``/``error.md``."""
        shutil.rmtree(self.work_root, ignore_errors=True)  # first: a partial result may be what filled the disk
        shutil.rmtree(self.out, ignore_errors=True)
        self.record = self.ctx.journal.record(replace(self.record, state=state, error=info))
        daemon = self.ctx.config.daemon
        if report is not None:
            write_report(report, self.job.job_dir)
            for name in _REPORTS:
                (self.job.job_dir / name).chmod(daemon.file_mode)
        failed = fail_job(self.job.job_dir, self.ctx.dirs.failed, self.job.name, info, model=self.job.model,
                          config_path=self.ctx.config.source, file_mode=daemon.file_mode, dir_mode=daemon.dir_mode)
        self.record = self.ctx.journal.record(replace(self.record, result=str(failed)))
        return failed

    def retire_input(self, result: Path | None = None) -> None:
        """The input leaves ``processing/``: to ``done/<name>`` (``keep_input``), beside a copy of
        the result's reports, or deleted."""
        shutil.rmtree(self.work_root, ignore_errors=True)
        if self.ctx.config.daemon.keep_input:
            for name in _REPORTS if result is not None else ():
                with contextlib.suppress(FileNotFoundError):  # an older result may lack report.html
                    shutil.copyfile(result / name, self.job.job_dir / name)
            rename_unique(self.job.job_dir, self.ctx.dirs.done, self.job.name)
        else:
            shutil.rmtree(self.job.job_dir)
        self.ctx.pool.forget(self.job.job_id)

    def interrupted(self) -> None:
        """Cancelled by shutdown: drop the partial result, give back this run's count, keep the job."""
        shutil.rmtree(self.out, ignore_errors=True)
        if self.bumped:
            self.record = self.ctx.journal.record(
                replace(self.record, state="claimed", attempts=max(0, self.record.attempts - 1)))
        self.ctx.pool.forget(self.job.job_id)
        _log.info("job.cancelled", name=self.job.name, reason="shutdown",
                  message="stays in processing/ and runs again at the next start")

    def _duration(self) -> float:
        return round(time.monotonic() - self.started, 3)


def _plain(value: Any) -> Any:
    """JSON-ready: mappings as dicts, tuples as lists (for the dedup key and the report)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
