"""``sharderd run``: the daemon's task tree, from start-up checks to a clean exit.

Three nested task groups (root: signals, watchdog, status; jobs: one task per claimed job; intake:
watcher, rescan, dispatcher, control), start-up, stopping, admission and storage faults are
described in docs/daemon.md, "Inside the daemon: the task tree".
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final, NoReturn, final

import anyio
import anyio.abc

from sharderd import __version__
from sharderd.childenv import child_env
from sharderd.cluster.errors import ClusterLostError
from sharderd.config import Config
from sharderd.daemon.control import Canceller, ControlWatch
from sharderd.daemon.filing import JobContext, cancel_claimed
from sharderd.daemon.intake import ClaimedJob
from sharderd.daemon.jobs import run_job
from sharderd.daemon.journal import Journal, RecoveredJob
from sharderd.daemon.metrics import MetricsExporter
from sharderd.daemon.notify import Notifier, watchdog_interval
from sharderd.daemon.procs import kill_children
from sharderd.daemon.queue import JobQueue, Seen, Waiting
from sharderd.daemon.recovery import finish_recovered, recover_jobs
from sharderd.daemon.startup import Opened, open_daemon
from sharderd.daemon.status import JobProgress, StatusBoard
from sharderd.daemon.watch import InboxEvents, InboxWatcher
from sharderd.logs import get_logger

__all__ = ["serve"]

_log = get_logger(__name__)

_HEARTBEAT_S: Final = 15.0
"""``status.json`` is rewritten at least this often, idle or not."""
_STATUS_MIN_INTERVAL_S: Final = 0.5
"""Rate limit of ``status.json`` rewrites and ``STATUS=`` lines when jobs change fast."""
_SETTLE_SLACK_S: Final = 0.05
"""Look this long after a settle deadline: entries seen in one scan then settle in one pass (so their
claims are ordered by priority), and float rounding cannot make the look come too early."""
_EXTEND_EVERY_S: Final = 5.0


async def serve(
    config: Config,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    signals: AsyncIterator[signal.Signals] | None = None,
) -> None:
    """Run the inbox daemon until SIGTERM or SIGINT; ``task_status.started()`` follows ``READY=1``.

    ``signals`` replaces the process's own SIGTERM and SIGINT (a test runs the daemon in its event
    loop and sends it "signals" through a stream): the first stops it, the second forces the stop.

    Raises:
        ConfigError: Start-up checks failed (root, folders, filesystems); nothing was claimed.
        ClusterLostError: The Ray head stayed lost; the daemon stopped its jobs first (exit 4).
    """
    daemon = _Daemon(open_daemon(config))
    try:
        daemon.start_up()
        if signals is None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                await daemon.run(task_status, received)
        else:
            await daemon.run(task_status, signals)
        if daemon.lost is not None:
            raise daemon.lost
    finally:
        with anyio.CancelScope(shield=True):
            await daemon.metrics.aclose()


@final
class _Daemon:
    """The daemon's state; its methods are the tasks of the tree described in the module docstring."""

    def __init__(self, opened: Opened) -> None:
        self.config = opened.config
        self.daemon = daemon = opened.config.daemon
        self.dirs = opened.dirs
        self.lock = opened.lock
        self.pool = opened.pool
        self.control_dir = opened.control_dir
        self.checks = {check.subject: check.ok for check in opened.checks}
        self.journal = Journal(self.dirs.state_dir)
        runtime = self.dirs.runtime
        self.board = StatusBoard(
            runtime, pool=self.pool, version=__version__, heartbeat_interval_s=_HEARTBEAT_S
        )
        self.notifier = Notifier()
        self.ctx = JobContext(
            self.config, self.dirs, self.journal, self.pool, self.board, child_env()
        )
        self.queue = JobQueue(self.config, processing=self.dirs.processing, journal=self.journal)
        self.events = InboxEvents()
        mode, polling = opened.watch_mode
        self.watcher = InboxWatcher(daemon, self.events, mode=mode, force_polling=polling)
        self.metrics = MetricsExporter(daemon.metrics_textfile, daemon.metrics_port)
        self.max_active = max(os.cpu_count() or 1, 2 * daemon.max_parallel_compiles)
        self.jobs: dict[str, anyio.CancelScope] = {}
        self.stop = anyio.Event()
        self.forced = False
        self.stopping = False
        self.lost: ClusterLostError | None = None  # the Ray head stayed lost: stop, then raise it
        self._job_ended = anyio.Event()
        self._job_tg: anyio.abc.TaskGroup | None = None

    # -- start-up ----------------------------------------------------------------------------

    def start_up(self) -> None:
        """Finish what an earlier run left, then start the metrics (last: nothing after it may fail)."""
        daemon = self.daemon
        _log.info(
            "daemon.started",
            pid=os.getpid(),
            version=__version__,
            config=str(self.config.source or "(defaults)"),
            inbox=str(self.dirs.inbox),
            outbox=str(self.dirs.outbox),
            state_dir=str(self.dirs.state_dir),
            runtime_dir=str(self.dirs.runtime),
            backend=daemon.backend,
            backend_check=self.checks.get("backend"),
            devices=daemon.devices,
            max_parallel_compiles=daemon.max_parallel_compiles,
            max_active_jobs=self.max_active,
            watch_mode=self.watcher.mode,
            shutdown=daemon.shutdown,
        )
        self.queue.backlog = recover_jobs(self.ctx)
        self._publish_pending()
        self.board.seed_recent(self.dirs.journal)
        self.metrics.start()

    # -- the tree ----------------------------------------------------------------------------

    async def run(
        self, task_status: anyio.abc.TaskStatus[None], signals: AsyncIterator[signal.Signals]
    ) -> None:
        async with anyio.create_task_group() as root:
            await root.start(self._handle_signals, signals)
            await root.start(self._watchdog)
            await root.start(self._publish_status)
            if (watch := getattr(self.pool.runner, "watch", None)) is not None:
                await root.start(watch, self._lost_head)  # a Ray cluster's head (cluster/head.py)
            async with anyio.create_task_group() as jobs:
                self._job_tg = jobs
                self._claim_ready()
                async with anyio.create_task_group() as intake:
                    if not self.stop.is_set():
                        await self._start_intake(intake)
                        task_status.started()
                    await self.stop.wait()
                    self.watcher.stop()
                    intake.cancel_scope.cancel()
                await self._stop_jobs()
            root.cancel_scope.cancel()
        self.board.set_state("stopped")
        self._write_status()
        left, lost = sum(1 for _ in self.dirs.processing.iterdir()), self.lost
        code = lost.exit_code if lost else 0
        _log.info(
            "daemon.stopped", left_in_processing=left, reason=lost and lost.reason, exit_code=code
        )

    async def _start_intake(self, intake: anyio.abc.TaskGroup) -> None:
        """The watcher first, *then* the first scan: a file arriving in between is seen by both."""
        await intake.start(self.watcher.run)
        self._scan()
        await intake.start(self._rescan)
        await intake.start(self._dispatch)
        watch = ControlWatch(
            self.dirs.inbox, self.control_dir, full_every_s=self.daemon.rescan_interval
        )
        canceller = Canceller(
            watch,
            board=self.board,
            scopes=self.jobs,
            queue=self.queue,
            claim=self._cancel_pending,
            file_cancelled=self._file_cancelled,
            changed=self._publish_pending,
        )
        await intake.start(canceller.run)
        self.board.set_state("ready")
        pending, running = self.board.pending, len(self.jobs)
        # Logged before systemd hears READY=1, so whoever sees the unit ready finds the line.
        _log.info("daemon.ready", inbox=str(self.dirs.inbox), pending=pending, running=running)
        self.notifier.ready(self.board.status_line())

    async def _handle_signals(
        self, signals: AsyncIterator[signal.Signals], *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        task_status.started()
        async for signum in signals:
            if not self.stop.is_set():
                self._begin_stop(signum)
            elif not self.forced:
                _log.warning(
                    "daemon.stopping",
                    signal=signum.name,
                    force=True,
                    message="second signal: cancelling every job and killing its processes now",
                )
                self._force()

    def _begin_stop(self, signum: signal.Signals | None, **cause: object) -> None:
        self.stopping = True
        self.board.set_state("stopping")
        running = len(self.jobs)
        shutdown = self.daemon.shutdown if self.lost is None else "kill"
        self.notifier.stopping(f"stopping ({shutdown}): {running} running")
        _log.info(
            "daemon.stopping",
            signal=signum and signum.name,
            **cause,
            shutdown=shutdown,
            running=running,
            timeout_s=self.daemon.shutdown_timeout if shutdown == "drain" else None,
        )
        self.stop.set()

    async def _stop_jobs(self) -> None:
        if self.daemon.shutdown == "drain" and not self.forced and self.lost is None:
            deadline = anyio.current_time() + self.daemon.shutdown_timeout
            while self.jobs and not self.forced:
                left = deadline - anyio.current_time()
                if left <= 0:
                    _log.warning(
                        "daemon.stopping",
                        shutdown="drain",
                        running=len(self.jobs),
                        message=f"shutdown_timeout ({self.daemon.shutdown_timeout:g} s) reached; cancelling the rest",
                    )
                    break
                step = min(left, _EXTEND_EVERY_S)
                self.notifier.extend_timeout(
                    int((step + self.daemon.kill_grace + _EXTEND_EVERY_S) * 1_000_000)
                )
                with anyio.move_on_after(step):
                    await self._job_ended.wait()
                self._job_ended = anyio.Event()
        for scope in self.jobs.values():
            scope.cancel()

    def _force(self) -> None:
        self.forced = True
        for scope in self.jobs.values():
            scope.cancel()
        kill_children()

    def _lost_head(self, lost: ClusterLostError) -> None:
        if not self.stop.is_set():
            self.lost = lost
            self._begin_stop(None, reason=lost.reason, message=lost.message)

    async def _watchdog(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        interval = watchdog_interval()
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await anyio.sleep(interval)

    async def _publish_status(self, *, task_status: anyio.abc.TaskStatus[None]) -> NoReturn:
        task_status.started()
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

    async def _rescan(self, *, task_status: anyio.abc.TaskStatus[None]) -> NoReturn:
        """Catch lost events, a recreated inbox and network filesystems."""
        task_status.started()
        while True:
            await anyio.sleep(self.daemon.rescan_interval)
            self.queue.retry_stuck(self.dirs.outbox, self._finish_stuck)
            self.watcher.check_inbox()
            self.events.request_scan()

    def _finish_stuck(self, found: RecoveredJob) -> None:
        self.board.record_outcome(finish_recovered(found, self.ctx))

    async def _dispatch(self, *, task_status: anyio.abc.TaskStatus[None]) -> NoReturn:
        """Settle, then claim: woken by watch events, rescans, finished jobs and settle deadlines."""
        task_status.started()
        while True:
            due = self.queue.inbox.due()
            delay = (
                float("inf") if due is None else max(0.0, due - time.monotonic()) + _SETTLE_SLACK_S
            )
            dirty, renamed, full_scan = await self.events.wait(delay)
            if full_scan:
                self._scan(renamed)
            else:
                self.queue.inbox.look({*dirty, *self.queue.inbox.settling()}, renamed)
                self._claim_ready()

    def _scan(self, renamed: frozenset[Path] = frozenset()) -> None:
        try:
            self.queue.inbox.scan(renamed)
        except OSError as exc:  # the inbox vanished or became unreadable; the rescan recreates it
            self.watcher.lost = True
            _log.error(
                "watch.failed", inbox=str(self.dirs.inbox), error=f"cannot scan the inbox: {exc}"
            )
        _log.debug("scan.finished", pending=len(self.queue.inbox))
        self._claim_ready()

    def _claim_ready(self) -> None:
        while not self.stopping and len(self.jobs) < self.max_active:
            waiting = self.queue.next_ready()
            if waiting is None:
                break
            self._start(waiting.job, waiting.priority)
        self._publish_pending()

    def _publish_pending(self) -> None:
        self.board.set_pending(*self.queue.pending())

    def _cancel_pending(self, seen: Seen, by: str) -> None:
        """Claim an inbox entry a request names and file it cancelled, without running it."""
        waiting = self.queue.claim(seen)
        if waiting is not None:
            self._file_cancelled(waiting, by)

    def _start(self, job: ClaimedJob, priority: int) -> None:
        assert self._job_tg is not None
        progress = JobProgress(job.job_id, job.name, priority)
        self.jobs[job.job_id] = scope = anyio.CancelScope()
        self.board.add(progress)
        self._job_tg.start_soon(self._job_task, job, progress, scope, name=f"job {job.job_id}")

    async def _job_task(
        self, job: ClaimedJob, progress: JobProgress, scope: anyio.CancelScope
    ) -> None:
        outcome = None
        try:
            with scope:
                outcome = await run_job(job, self.ctx, progress)
            if scope.cancelled_caught and progress.cancel_requested is not None:
                # run_job filed it under failed/ before the cancellation went on
                outcome = "cancelled"
        except Exception:
            # filing the job itself failed (disk full?): it stays, for the next rescan
            self.queue.park(job, progress.priority, "could not finish the job's bookkeeping")
        finally:
            self.jobs.pop(job.job_id, None)
            self.board.remove(job.job_id, outcome)
            self._job_ended.set()
            self.events.wake()

    def _file_cancelled(self, waiting: Waiting, by: str) -> None:
        """File a claimed job that never ran as cancelled."""
        job = waiting.job
        try:
            self.board.record_outcome(cancel_claimed(job, self.ctx, by))
        except Exception:
            # as in _job_task: the job stays in processing/ until its bookkeeping succeeds
            self.queue.park(job, waiting.priority, "could not file the cancelled job")
