"""``sharderd run``: the daemon's task tree, from start-up checks to a clean exit.

Three nested task groups, each outliving the one inside it:

- *root*: signals, the systemd watchdog and the status publisher; they run until the very end, so
  ``WATCHDOG=1`` and ``status.json`` keep coming while jobs drain.
- *jobs*: one task per claimed job, all sharing one ``AttemptPool(max_parallel_compiles)``.
- *intake*: the inbox watcher, the periodic rescan, the dispatcher that settles and claims, and the
  control task that acts on cancel requests (``daemon/control.py``).

Start-up: refuse root (unless ``allow_root``), create and check the folders, finish what the journal
says an earlier run left (before any task exists, so a start-up error is a plain ``ConfigError``),
start the watcher, *then* scan the inbox, then ``READY=1``. A file that arrives in between is seen
by both, never by neither. Stopping (SIGTERM/SIGINT): the intake group goes first, so nothing new
is claimed; ``shutdown = "kill"`` cancels the jobs (their attempt groups are killed, they stay in
``processing/``), ``"drain"`` lets them finish within ``shutdown_timeout``. A second signal kills
every child process group at once.

Admission: a job holds a planning worker (the analysed model, in memory) for its whole life, so
at most ``max(cpu count, 2 × max_parallel_compiles)`` jobs run at once; the rest wait *in the
inbox*, unclaimed, where another daemon sharing the inbox may take them. Among settled entries
the highest sidecar ``priority`` is claimed first, then the oldest.

Storage faults: a job whose own bookkeeping cannot be written (disk full) stays in ``processing/``
and, at the next rescan, gets what a restart would give it: finished if its outcome was decided,
else run again. The daemon itself never stops over a failed write.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import signal
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, NoReturn, final

import anyio
import anyio.abc
from watchfiles import Change, awatch

from sharderd import __version__
from sharderd.backends.pool import AttemptPool
from sharderd.config import Config, DaemonConfig
from sharderd.daemon.control import CancelRequest, ControlWatch, ensure_control_dir
from sharderd.daemon.intake import (
    Candidate,
    ClaimedJob,
    InboxFilter,
    Settler,
    claim,
    inspect_entry,
    is_staging_name,
    new_job_id,
    scan_inbox,
)
from sharderd.daemon.jobs import (
    JobContext,
    WorkerCrashedError,
    cancel_claimed,
    fail_claimed,
    finish_recovered,
    mark_lost,
    reclaim,
    run_job,
)
from sharderd.daemon.journal import JobRecord, Journal, RecoveredJob, recover
from sharderd.daemon.lock import StateLock
from sharderd.daemon.metrics import MetricsExporter
from sharderd.daemon.notify import Notifier, child_env, watchdog_interval
from sharderd.daemon.outbox import DaemonDirs, find_published, prepare_dirs
from sharderd.daemon.renames import RenameWatch
from sharderd.daemon.sidecar import load_sidecar
from sharderd.daemon.status import JobProgress, StatusBoard
from sharderd.errors import ConfigError
from sharderd.logs import get_logger

__all__ = ["serve"]

_log = get_logger(__name__)

_HEARTBEAT_S: Final = 15.0
"""``status.json`` is rewritten at least this often, idle or not."""
_STATUS_MIN_INTERVAL_S: Final = 0.5
"""Rate limit of ``status.json`` rewrites and ``STATUS=`` lines when jobs change fast."""
_WATCH_DEBOUNCE_MS: Final = 500
_WATCH_STEP_MS: Final = 50
_WATCH_TIMEOUT_MS: Final = 1000
"""The watch thread returns this often even without changes, bounding any wait for it to stop."""
_WATCH_ARM_POLL_S: Final = 0.01
_WATCH_BACKOFF_S: Final = (0.5, 30.0)
_SETTLE_SLACK_S: Final = 0.05
"""Look this long after a settle deadline: entries seen in one scan then settle in one pass (so their
claims are ordered by priority), and float rounding cannot make the look come too early."""
_EXTEND_EVERY_S: Final = 5.0
_CONTROL_POLL_S: Final = 1.0
"""How often the control task looks for cancel requests (two ``stat`` calls when there are none)."""
_NETWORK_FS: Final = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "afs", "ceph",
                                "glusterfs", "lustre", "gpfs", "beegfs"})
"""Mounts where inotify misses writes made by other hosts; ``watch_mode = "auto"`` polls them."""


async def serve(config: Config, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run the inbox daemon until SIGTERM or SIGINT; ``task_status.started()`` follows ``READY=1``.

    Raises:
        ConfigError: Start-up checks failed (root, folders, filesystems); nothing was claimed.
    """
    daemon = _Daemon(config)
    await daemon.run(task_status)


@final
class _WatchStop:
    """awatch's stop event; the watch thread polls ``is_set``, which proves the watcher is live.

    Only plain attribute reads and writes cross the thread boundary (atomic under the GIL).
    """

    __slots__ = ("_set", "armed")

    def __init__(self) -> None:
        self.armed = False
        self._set = False

    def is_set(self) -> bool:
        self.armed = True
        return self._set

    def set(self) -> None:
        self._set = True


@dataclass(slots=True)
class _Seen:
    """An inbox entry from its first look until it is claimed."""

    job_id: str
    candidate: Candidate
    order: int
    ready: bool = False
    priority: int = 0


@final
class _Inbox:
    """Candidates from detection to claim: settling (``Settler``), then ready in priority order."""

    def __init__(self, inbox: Path, config: Config) -> None:
        self.inbox = inbox
        self.config = config
        self.settler = Settler(config.daemon.settle_seconds)
        self.seen: dict[Path, _Seen] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self.seen)

    def scan(self, renamed: frozenset[Path] = frozenset()) -> None:
        """Look at every entry; forget the ones that are gone."""
        candidates = scan_inbox(self.inbox)
        present = {c.path for c in candidates}
        for path in [p for p in self.seen if p not in present]:
            self._vanished(path)
        for candidate in candidates:
            self._observe(candidate, renamed=candidate.path in renamed)

    def look(self, paths: Iterable[Path], renamed: frozenset[Path]) -> None:
        for path in paths:
            candidate = inspect_entry(self.inbox, path.name)
            if candidate is None:
                self._vanished(path)
            else:
                self._observe(candidate, renamed=path in renamed)

    def settling(self) -> list[Path]:
        return [p for p, s in self.seen.items() if not s.ready]

    def due(self) -> float | None:
        """``time.monotonic()`` value at which a settling entry may be complete."""
        return self.settler.next_due()

    def listing(self) -> Iterator[tuple[str, str]]:
        """``(job_id, name)`` of every entry, in detection order."""
        return ((s.job_id, s.candidate.name) for s in self.seen.values())

    def take(self, match: Callable[[str, str], bool]) -> list[_Seen]:
        """Remove and return the entries ``match(job_id, name)`` selects, settled or not."""
        taken = [s for s in self.seen.values() if match(s.job_id, s.candidate.name)]
        for seen in taken:
            self.settler.forget(seen.candidate.path)
            del self.seen[seen.candidate.path]
        return taken

    def take_ready(self) -> _Seen | None:
        """The ready entry to claim next, checked once more; None when none is ready."""
        while True:
            ready = [s for s in self.seen.values() if s.ready]
            if not ready:
                return None
            best = min(ready, key=lambda s: (-s.priority, s.order))
            path = best.candidate.path
            again = inspect_entry(self.inbox, path.name)
            if again is None:
                self._vanished(path)
            elif again.signature != best.candidate.signature:
                self._observe(again, renamed=False)  # written to again: settle anew
            else:
                del self.seen[path]
                return best

    def _observe(self, candidate: Candidate, *, renamed: bool) -> None:
        seen = self.seen.get(candidate.path)
        if seen is None:
            seen = self.seen[candidate.path] = _Seen(new_job_id(), candidate, self._order)
            self._order += 1
            _log.info("job.detected", job_id=seen.job_id, name=candidate.name, path=str(candidate.path),
                      kind=candidate.kind, moved_in=renamed)
        elif seen.ready and seen.candidate.signature == candidate.signature:
            return
        seen.candidate = candidate
        seen.ready = self.settler.observe(candidate, renamed=renamed)
        if seen.ready:
            self.settler.forget(candidate.path)
            seen.priority = self._priority(candidate)

    def _priority(self, candidate: Candidate) -> int:
        """The sidecar's priority; a bad sidecar counts as 0 here and fails the job once claimed."""
        if candidate.sidecar is None or candidate.problem is not None:
            return 0
        try:
            return load_sidecar(candidate.sidecar, self.config.daemon).priority
        except Exception:  # even a parser bug (RecursionError on deep nesting) must not stop the intake
            return 0

    def _vanished(self, path: Path) -> None:
        self.settler.forget(path)
        seen = self.seen.pop(path, None)
        if seen is not None:
            _log.debug("job.skipped", job_id=seen.job_id, name=seen.candidate.name, reason="vanished before it was claimed")


@final
class _Daemon:
    """The daemon's state; its methods are the tasks of the tree described in the module docstring."""

    def __init__(self, config: Config) -> None:
        if os.geteuid() == 0 and not config.daemon.allow_root:
            raise ConfigError(
                "refusing to run as root: every model would be parsed and compiled with root privileges",
                hint="Run as the sharderd user (the systemd unit does), or set allow_root = true in [daemon].")
        daemon = _absolute(config.daemon)
        self.config = replace(config, daemon=daemon)
        self.daemon = daemon
        self.dirs: DaemonDirs = prepare_dirs(daemon)
        self.lock = StateLock(self.dirs.state_dir)  # before anything reads or writes the journal
        self.journal = Journal(self.dirs.state_dir)
        self.runner = _cluster_runner(config)
        self.pool = AttemptPool(daemon.max_parallel_compiles, runner=self.runner)
        self.board = StatusBoard(self.dirs.runtime, pool=self.pool, version=__version__, heartbeat_interval_s=_HEARTBEAT_S)
        self.notifier = Notifier()
        self.ctx = JobContext(self.config, self.dirs, self.journal, self.pool, self.board, child_env())
        self.inbox = _Inbox(self.dirs.inbox, self.config)
        self.max_active = max(os.cpu_count() or 1, 2 * daemon.max_parallel_compiles)
        self.watch_mode, self.force_polling = _watch_mode(daemon)
        self.backlog: list[tuple[ClaimedJob, int]] = []
        self.stuck: list[tuple[ClaimedJob, int]] = []
        """Jobs whose bookkeeping failed (disk full?); retried at the next rescan."""
        self.jobs: dict[str, anyio.CancelScope] = {}
        self.stop = anyio.Event()
        self.forced = False
        self.stopping = False
        self._job_ended = anyio.Event()
        self._wake = anyio.Event()
        self._dirty: set[Path] = set()
        self._renamed: set[Path] = set()
        """Inbox entries an ``IN_MOVED_TO`` named since the last dispatch: complete once confirmed."""
        self._full_scan = False
        self._watch_stop = _WatchStop()
        self._inbox_id = _dir_id(self.dirs.inbox)
        self._inbox_lost = False
        self._job_tg: anyio.abc.TaskGroup | None = None
        try:
            self.control_dir = ensure_control_dir(self.dirs.state_dir, daemon.dir_mode)
        except OSError as exc:
            raise ConfigError(f"cannot create {self.dirs.state_dir / 'control'}: {exc.strerror}") from None
        self.metrics = MetricsExporter(daemon.metrics_textfile, daemon.metrics_port)
        _log.info("daemon.started", pid=os.getpid(), version=__version__, config=str(config.source or "(defaults)"),
                  inbox=str(self.dirs.inbox), outbox=str(self.dirs.outbox), state_dir=str(self.dirs.state_dir),
                  runtime_dir=str(self.dirs.runtime), backend=daemon.backend, devices=daemon.devices,
                  max_parallel_compiles=daemon.max_parallel_compiles, max_active_jobs=self.max_active,
                  watch_mode=self.watch_mode, shutdown=daemon.shutdown)
        self._recover()
        self.board.seed_recent(self.dirs.journal)
        self.metrics.start()  # last: nothing after it may fail, or its server would outlive us

    # -- start-up ----------------------------------------------------------------------------

    def _recover(self) -> None:
        strays = _kill_strays(self.dirs.processing)
        report = recover(self.dirs.state_dir, self.dirs.outbox, max_attempts=self.daemon.max_attempts, journal=self.journal)
        for found in report.finish:
            self.board.finished[finish_recovered(found, self.ctx)] += 1
        for found in report.to_fail:
            attempts = found.record.attempts if found.record else 0
            error = WorkerCrashedError(
                f"sharderd stopped unexpectedly during each of the {attempts} runs of this job (max_attempts reached)",
                hint="The planning worker or a compile may be exhausting the host's memory, which kills the whole "
                     "service; check `journalctl -k` for the OOM killer and `journalctl -u sharderd` for this job id.")
            self.board.finished[fail_claimed(reclaim(found), self.ctx, error)] += 1
        for record in report.stale:
            mark_lost(record, self.journal)
        resumed = [(reclaim(f), f.record.priority if f.record else 0) for f in report.resume]
        self.backlog = sorted(resumed, key=lambda item: (-item[1], item[0].job_id))
        self._publish_pending()
        _log.info("journal.recovered", resume=len(report.resume), finished=len(report.finish),
                  failed=len(report.to_fail), lost=len(report.stale), removed=[str(p) for p in report.removed],
                  killed_strays=strays)

    # -- the tree ----------------------------------------------------------------------------

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            await self._run(task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self.metrics.aclose()

    async def _run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as root:
                root.start_soon(self._handle_signals, signals)
                root.start_soon(self._watchdog)
                root.start_soon(self._publish_status)
                async with anyio.create_task_group() as jobs:
                    self._job_tg = jobs
                    self._claim_ready()
                    async with anyio.create_task_group() as intake:
                        if not self.stop.is_set():
                            await intake.start(self._watch)
                            self._scan()
                            intake.start_soon(self._rescan)
                            intake.start_soon(self._dispatch)
                            intake.start_soon(self._control)
                            self.board.set_state("ready")
                            self.notifier.ready(self.board.status_line())
                            _log.info("daemon.ready", inbox=str(self.dirs.inbox), pending=self.board.pending,
                                      running=len(self.jobs))
                            task_status.started()
                        await self.stop.wait()
                        self._watch_stop.set()
                        intake.cancel_scope.cancel()
                    await self._stop_jobs()
                root.cancel_scope.cancel()
        self.board.set_state("stopped")
        self._write_status()
        _log.info("daemon.stopped", left_in_processing=sum(1 for _ in self.dirs.processing.iterdir()))

    async def _handle_signals(self, signals: AsyncIterator[signal.Signals]) -> None:
        async for signum in signals:
            if not self.stop.is_set():
                self._begin_stop(signum)
            elif not self.forced:
                _log.warning("daemon.stopping", signal=signum.name, force=True,
                             message="second signal: cancelling every job and killing its processes now")
                self._force()

    def _begin_stop(self, signum: signal.Signals) -> None:
        self.stopping = True
        self.board.set_state("stopping")
        running = len(self.jobs)
        self.notifier.stopping(f"stopping ({self.daemon.shutdown}): {running} running")
        _log.info("daemon.stopping", signal=signum.name, shutdown=self.daemon.shutdown, running=running,
                  timeout_s=self.daemon.shutdown_timeout if self.daemon.shutdown == "drain" else None)
        self.stop.set()

    async def _stop_jobs(self) -> None:
        if self.daemon.shutdown == "drain" and not self.forced:
            deadline = anyio.current_time() + self.daemon.shutdown_timeout
            while self.jobs and not self.forced:
                left = deadline - anyio.current_time()
                if left <= 0:
                    _log.warning("daemon.stopping", shutdown="drain", running=len(self.jobs),
                                 message=f"shutdown_timeout ({self.daemon.shutdown_timeout:g} s) reached; cancelling the rest")
                    break
                step = min(left, _EXTEND_EVERY_S)
                self.notifier.extend_timeout(int((step + self.daemon.kill_grace + _EXTEND_EVERY_S) * 1_000_000))
                with anyio.move_on_after(step):
                    await self._job_ended.wait()
                self._job_ended = anyio.Event()
        for scope in self.jobs.values():
            scope.cancel()

    def _force(self) -> None:
        self.forced = True
        for scope in self.jobs.values():
            scope.cancel()
        _kill_children()

    async def _watchdog(self) -> None:
        interval = watchdog_interval()
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await anyio.sleep(interval)

    async def _publish_status(self) -> NoReturn:
        last_line = ""
        while True:
            with anyio.move_on_after(self.board.heartbeat_interval_s):
                await self.board.wait_changed()
            self._write_status()
            line = self.board.status_line()
            if line != last_line:
                self.notifier.status(line)
                last_line = line
            await anyio.sleep(_STATUS_MIN_INTERVAL_S)

    def _write_status(self) -> None:
        try:
            path = self.board.write()
        except OSError as exc:
            _log.warning("status.written", ok=False, path=str(self.board.path), error=str(exc))
        else:
            _log.debug("status.written", path=str(path))
        self.metrics.publish(self.board.figures())

    # -- intake ------------------------------------------------------------------------------

    async def _watch(self, *, task_status: anyio.abc.TaskStatus[None]) -> NoReturn:
        """Keep a watcher on the inbox: restarted on request (a recreated inbox) or after errors."""
        announced = False
        polling = self.force_polling
        backoff = _WATCH_BACKOFF_S[0]
        restarts = 0
        while True:
            stop = self._watch_stop = _WatchStop()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._consume, stop, polling)
                    while not stop.armed:
                        await anyio.sleep(_WATCH_ARM_POLL_S)
                    mode = "poll" if polling else "inotify"
                    if restarts:
                        _log.info("watch.restarted", inbox=str(self.dirs.inbox), mode=mode, restarts=restarts)
                    else:
                        _log.info("watch.started", inbox=str(self.dirs.inbox), mode=mode)
                    if not announced:
                        announced = True
                        task_status.started()
                    backoff = _WATCH_BACKOFF_S[0]
            except Exception as exc:
                error = _leaf(exc)
                limit = _is_watch_limit(error)
                _log.error("watch.failed", inbox=str(self.dirs.inbox), error=f"{type(error).__name__}: {error}",
                           retry_in_s=backoff, fallback="poll" if limit and not polling else None,
                           hint=("inotify limits reached: raise fs.inotify.max_user_watches / max_user_instances "
                                 "(sysctl), or set watch_mode = \"poll\"") if limit else
                           "the periodic rescan keeps finding new jobs meanwhile")
                polling = polling or limit
                if not announced:
                    announced = True
                    task_status.started()  # the rescan still finds jobs; do not block start-up on the watcher
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _WATCH_BACKOFF_S[1])
            restarts += 1

    async def _consume(self, stop: _WatchStop, polling: bool | None) -> None:
        """Watch the inbox itself, not below it: a recursive watch (and watchfiles' poller at any
        depth) follows a symlinked folder in the inbox and walks what it names (``/etc``, ``/``).
        Polling is our own full scan, which only ``lstat``s; a folder job filled in place is seen by
        its settle looks or the rescan."""
        if polling:
            while not stop.is_set():
                await anyio.sleep(self.daemon.poll_interval)
                self._full_scan = True
                self._wake.set()
            return
        try:
            renames = RenameWatch.open(self.dirs.inbox)
        except OSError as exc:  # inotify limits: only the fast path is lost, renamed-in jobs settle
            renames = None
            _log.warning("watch.renames_unavailable", inbox=str(self.dirs.inbox), error=str(exc),
                         message="jobs renamed in wait settle_seconds like jobs written in place")
        try:
            async with anyio.create_task_group() as tg:
                if renames is not None:
                    tg.start_soon(self._renames, renames)
                async for changes in awatch(
                    self.dirs.inbox, watch_filter=InboxFilter(self.dirs.inbox), debounce=_WATCH_DEBOUNCE_MS,
                    step=_WATCH_STEP_MS, stop_event=stop, rust_timeout=_WATCH_TIMEOUT_MS, force_polling=polling,
                    poll_delay_ms=int(self.daemon.poll_interval * 1000), recursive=False,
                    ignore_permission_denied=True,
                ):
                    self._on_changes(changes)
                tg.cancel_scope.cancel()
        finally:
            if renames is not None:
                renames.close()

    async def _renames(self, watch: RenameWatch) -> None:
        """Feed the renames the kernel reports to the dispatcher (the fast path of ``Settler``)."""
        while (batch := await watch.next_batch()) is not None:
            top = {p for p in batch if not is_staging_name(p.name)}
            if top:
                self._renamed |= top
                self._dirty |= top
                self._wake.set()

    def _on_changes(self, changes: set[tuple[Change, str]]) -> None:
        inbox = self.dirs.inbox
        for _, raw in changes:
            path = Path(raw)
            if path == inbox or not path.is_relative_to(inbox):
                self._full_scan = True
                self._inbox_lost = self._inbox_lost or path == inbox  # the inbox itself went or came
                continue
            self._dirty.add(inbox / path.relative_to(inbox).parts[0])
        self._wake.set()

    async def _rescan(self) -> NoReturn:
        """Catch lost events, a recreated inbox and network filesystems."""
        while True:
            await anyio.sleep(self.daemon.rescan_interval)
            self._retry_stuck()
            self._check_inbox()
            self._full_scan = True
            self._wake.set()

    def _check_inbox(self) -> None:
        """Recreate a deleted inbox; restart the watcher when the inbox is a different folder now.

        The inode alone cannot tell: a folder recreated at once often gets the old inode back. So a
        watch event on the inbox itself, or a failed scan, also marks the watch as lost.
        """
        inbox = self.dirs.inbox
        try:
            if not inbox.is_dir():
                inbox.mkdir(mode=self.daemon.dir_mode, parents=True)
                self._inbox_lost = True
            current = _dir_id(inbox)
        except OSError as exc:
            _log.error("watch.failed", inbox=str(inbox), error=f"cannot recreate the inbox: {exc}")
            return
        if current != self._inbox_id or self._inbox_lost:
            self._inbox_id = current
            self._inbox_lost = False
            self._watch_stop.set()  # the watcher loop starts a new one and logs watch.restarted

    async def _dispatch(self) -> NoReturn:
        """Settle, then claim: woken by watch events, rescans, finished jobs and settle deadlines."""
        while True:
            due = self.inbox.due()
            delay = math.inf if due is None else max(0.0, due - time.monotonic()) + _SETTLE_SLACK_S
            with anyio.move_on_after(delay):
                await self._wake.wait()
            self._wake = anyio.Event()
            dirty, renamed = self._dirty, frozenset(self._renamed)
            self._dirty, self._renamed = set(), set()
            if self._full_scan:
                self._full_scan = False
                self._scan(renamed)
            else:
                self.inbox.look({*dirty, *self.inbox.settling()}, renamed)
                self._claim_ready()

    def _scan(self, renamed: frozenset[Path] = frozenset()) -> None:
        try:
            self.inbox.scan(renamed)
        except OSError as exc:  # the inbox vanished or became unreadable; the rescan recreates it
            self._inbox_lost = True
            _log.error("watch.failed", inbox=str(self.dirs.inbox), error=f"cannot scan the inbox: {exc}")
        _log.debug("scan.finished", pending=len(self.inbox))
        self._claim_ready()

    def _claim_ready(self) -> None:
        while not self.stopping and len(self.jobs) < self.max_active:
            if self.backlog:
                job, priority = self.backlog.pop(0)
                _log.info("job.resumed", job_id=job.job_id, name=job.name, priority=priority)
                self._start(job, priority)
                continue
            seen = self.inbox.take_ready()
            if seen is None:
                break
            self._claim(seen)
        self._publish_pending()

    def _publish_pending(self) -> None:
        backlog = ((job.job_id, job.name) for job, _ in self.backlog)
        self.board.set_pending(len(self.inbox) + len(self.backlog), itertools.chain(backlog, self.inbox.listing()))

    def _claim(self, seen: _Seen, *, cancelled_by: str | None = None) -> None:
        candidate = seen.candidate
        try:
            job = claim(candidate, self.dirs.processing, seen.job_id, dir_mode=self.daemon.dir_mode)
        except OSError as exc:
            _log.error("job.skipped", job_id=seen.job_id, name=candidate.name, reason=f"cannot claim: {exc}")
            return
        if job is None:
            _log.debug("job.skipped", job_id=seen.job_id, name=candidate.name, reason="taken before the claim")
            return
        try:
            self.journal.record(JobRecord(job.job_id, job.name, state="claimed", priority=seen.priority))
        except OSError as exc:  # disk full: the job task tries to record it again, else it waits as stuck
            _log.error("daemon.error", job_id=job.job_id, name=job.name, error=str(exc),
                       message="could not journal the claim")
        _log.info("job.claimed", job_id=job.job_id, name=job.name, kind=job.kind, priority=seen.priority,
                  path=str(job.entry))
        if cancelled_by is None:
            self._start(job, seen.priority)
        else:
            self._cancel_unstarted(job, seen.priority, cancelled_by)

    def _retry_stuck(self) -> None:
        """Give each stuck job what a restart would: finish a decided outcome, else queue it again."""
        stuck, self.stuck = self.stuck, []
        for job, priority in stuck:
            try:
                record = self.journal.get(job.job_id)
                published = None if record and record.terminal else find_published(self.dirs.outbox, job.name, job.job_id)
                if published is None and (record is None or not record.terminal):
                    self.backlog.append((job, priority))
                    continue
                found = RecoveredJob(job.job_id, job.name, job.job_dir, record, published)
                self.board.record_outcome(finish_recovered(found, self.ctx))
            except (OSError, ValueError) as exc:
                self.stuck.append((job, priority))
                _log.error("daemon.error", job_id=job.job_id, name=job.name, error=str(exc),
                           message="still cannot finish the job's bookkeeping; it stays in processing/")

    def _start(self, job: ClaimedJob, priority: int) -> None:
        assert self._job_tg is not None
        progress = JobProgress(job.job_id, job.name, priority)
        self.jobs[job.job_id] = scope = anyio.CancelScope()
        self.board.add(progress)
        self._job_tg.start_soon(self._job_task, job, progress, scope, name=f"job {job.job_id}")

    async def _job_task(self, job: ClaimedJob, progress: JobProgress, scope: anyio.CancelScope) -> None:
        outcome = None
        try:
            with scope:
                outcome = await run_job(job, self.ctx, progress)
            if scope.cancelled_caught and progress.cancel_requested is not None:
                outcome = "cancelled"  # run_job filed it under failed/ before the cancellation went on
        except Exception:  # filing the job itself failed (disk full?): it stays, for the next rescan
            self.stuck.append((job, progress.priority))
            _log.exception("daemon.error", job_id=job.job_id, name=job.name,
                           message="could not finish the job's bookkeeping; it stays in processing/ and is tried again at the next rescan")
        finally:
            self.jobs.pop(job.job_id, None)
            self.board.remove(job.job_id, outcome)
            self._job_ended.set()
            self._wake.set()


    # -- control -----------------------------------------------------------------------------

    async def _control(self) -> NoReturn:
        """Act on cancel requests; polled: they are rare, and files survive a restart."""
        watch = ControlWatch(self.dirs.inbox, self.control_dir, full_every_s=self.daemon.rescan_interval)
        while True:
            for request in watch.poll():
                self._cancel(request)
            await anyio.sleep(_CONTROL_POLL_S)

    def _cancel(self, request: CancelRequest) -> None:
        """Cancel every running, pending or resumable job the request names, then drop the request."""
        hits = 0
        for job_id, progress in list(self.board.running.items()):
            scope = self.jobs.get(job_id)
            if scope is None or not request.matches(job_id, progress.name):
                continue
            hits += 1
            if progress.cancel_requested is None:
                progress.cancel_requested = request.by
                scope.cancel()  # run_job kills its attempts (kill_grace), then files the job
                _log.info("cancel.requested", job_id=job_id, name=progress.name, by=request.by, stage=progress.stage)
        for seen in self.inbox.take(request.matches):
            hits += 1
            _log.info("cancel.requested", job_id=seen.job_id, name=seen.candidate.name, by=request.by, stage="pending")
            self._claim(seen, cancelled_by=request.by)
        for job, priority in [b for b in self.backlog if request.matches(b[0].job_id, b[0].name)]:
            hits += 1
            self.backlog.remove((job, priority))
            _log.info("cancel.requested", job_id=job.job_id, name=job.name, by=request.by, stage="pending")
            self._cancel_unstarted(job, priority, request.by)
        request.done()
        self._publish_pending()
        if not hits:
            _log.warning("cancel.ignored", job_id=request.job_id, name=request.name, by=request.by,
                         message="no pending or running job matches; the request was removed")

    def _cancel_unstarted(self, job: ClaimedJob, priority: int, by: str) -> None:
        try:
            self.board.record_outcome(cancel_claimed(job, self.ctx, by))
        except Exception:  # as in _job_task: the job stays in processing/ until its bookkeeping succeeds
            self.stuck.append((job, priority))
            _log.exception("daemon.error", job_id=job.job_id, name=job.name,
                           message="could not file the cancelled job; it stays in processing/ and is tried again at the next rescan")


def _cluster_runner(config: Config) -> object | None:
    """The Ray runner for ``[cluster] engine = "ray"`` (joined now, before ready), else None."""
    if config.cluster.engine != "ray":
        return None
    from sharderd.cluster.executor import RayRunner

    runner = RayRunner(config.cluster)
    runner.connect()
    return runner


def _absolute(daemon: DaemonConfig) -> DaemonConfig:
    """Absolute folders: watch events name absolute paths, and they must compare equal to ours."""
    runtime = None if daemon.runtime_dir is None else daemon.runtime_dir.absolute()
    return replace(daemon, inbox=daemon.inbox.absolute(), outbox=daemon.outbox.absolute(),
                   state_dir=daemon.state_dir.absolute(), runtime_dir=runtime)


def _watch_mode(daemon: DaemonConfig) -> tuple[str, bool | None]:
    """``(description, force_polling)``; ``None`` lets ``WATCHFILES_FORCE_POLLING`` decide."""
    if daemon.watch_mode == "poll":
        return "poll", True
    if daemon.watch_mode == "inotify":
        return "inotify", False
    fstype = _network_fs(daemon.inbox)
    return (f"poll (auto: {fstype})", True) if fstype else ("auto", None)


def _network_fs(path: Path) -> str | None:
    """The type of the mount holding ``path`` when it is a network or FUSE filesystem."""
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, fstype = "", ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, tail[0]
    return fstype if fstype in _NETWORK_FS or fstype.startswith("fuse") else None


def _dir_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    return st.st_dev, st.st_ino


def _is_watch_limit(error: BaseException) -> bool:
    return isinstance(error, OSError) and ("limit" in str(error).lower() or error.errno in (28, 24))


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _processes() -> Iterator[tuple[int, int, int]]:
    """``(pid, ppid, pgid)`` of every process in ``/proc``; ones vanishing meanwhile are skipped."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()  # comm may hold spaces and parentheses
        if len(fields) >= 3:
            yield int(entry.name), int(fields[1]), int(fields[2])


def _kill_group(pid: int, pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def _kill_children() -> None:
    """SIGKILL the process group of every child: planning workers and attempts lead their own."""
    me = os.getpid()
    for pid, ppid, pgid in list(_processes()):
        if ppid == me:
            _kill_group(pid, pgid)


def _kill_strays(processing: Path) -> list[int]:
    """SIGKILL attempts an earlier, killed daemon left running (their cwd is in ``processing/``).

    Under systemd the cgroup is emptied when the daemon dies; started by hand, an orphaned compile
    would keep its device and CPU, and keep writing into a job folder this run is about to reuse.
    """
    inside = str(processing) + os.sep
    killed = []
    for pid, _, pgid in list(_processes()):
        try:
            cwd = str(Path(f"/proc/{pid}/cwd").readlink())
        except OSError:
            continue
        if cwd.startswith(inside):
            _kill_group(pid, pgid)
            killed.append(pid)
    return killed
