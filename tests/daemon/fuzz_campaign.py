"""The daemon's fuzz campaign: inputs by kind (``tests/fuzz_inputs.py``) through one real
``sharderd run``, restarted on the way (SIGTERM and ``kill -9`` in turn), with the figures that say
whether it held: deaths, stuck jobs, jobs ended twice or never, restarts that were not clean.

``campaign(root, count)`` runs it and returns ``CampaignResult``; it asserts nothing itself, so a
long run (``bench/daemon_soak.py --skip kill --skip burst --skip corpus``) reports every problem
rather than the first. ``tests/daemon/test_fuzz_daemon.py`` runs it at CI size and asserts.

A job is *stuck* when it has not ended ``deadline_s`` after it was claimed (or twice that after it
was dropped, unclaimed); a stuck job of a ``KNOWN`` kind (a pathology another change fixes) is
cancelled with ``sharderd cancel`` and recorded as known, any other is a finding.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon_helpers import DaemonProcess, write_config
from fuzz_inputs import KINDS, KNOWN, WEIGHTS, Input, make_input, token_of

__all__ = ["CampaignResult", "campaign"]

_TOKEN = re.compile(r"i(\d{4})")
_TERMINAL = frozenset({"succeeded", "duplicate", "failed", "cancelled"})


@dataclass(slots=True)
class CampaignResult:
    inputs: int
    jobs: int
    by_kind: dict[str, dict[str, int]]
    """Per kind: ``inputs`` and each outcome (``succeeded``, ``duplicate``, ``failed: <reason>``,
    ``cancelled``, ``left alone`` for what is no job)."""
    deaths: int = 0
    """The daemon process ended without being told to."""
    stuck: list[str] = field(default_factory=list)
    known_stuck: list[str] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    """Jobs that ended as a sharderd bug (``_is_bug``), of kinds no other change is fixing."""
    known_internal: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Anything else that broke a promise: a job ended twice or never, a valid model not published,
    a non-job touched, a leftover, a restart that was not clean."""
    restarts: int = 0
    latency_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Claim to end: median, p99, max (cancelled stuck jobs left out)."""
    rss_bytes: tuple[int, int] = (0, 0)
    """The daemon's RSS at ready and at the end (of its last life)."""
    seconds: float = 0.0


def campaign(
    root: Path,
    count: int,
    *,
    seed: int = 1,
    restart_every: int = 250,
    outstanding: int = 8,
    deadline_s: float = 300.0,
    kinds: tuple[str, ...] = KINDS,
    weights: tuple[int, ...] = WEIGHTS,
) -> CampaignResult:
    """Drop ``count`` inputs (at most ``outstanding`` unfinished at a time) into one daemon."""
    started = time.monotonic()
    rng = random.Random(seed)
    config = write_config(root, rescan_interval=2.0, settle_seconds=0.5)
    run = _Run(root, config, deadline_s)
    inputs: list[Input] = []
    try:
        run.start()
        rss_ready = _rss(run.daemon.pid)
        for index in range(count):
            if restart_every and index and index % restart_every == 0:
                run.restart(kill=(index // restart_every) % 2 == 0)
            while run.unfinished(inputs) >= outstanding:
                run.poll(inputs)
            kind = rng.choices(kinds, weights)[0]
            item = make_input(index, kind, rng, root / "staging")
            for entry in item.entries:
                entry.rename(root / "inbox" / entry.name)
            run.dropped[index] = time.monotonic()
            inputs.append(item)
        while run.unfinished(inputs):
            run.poll(inputs)
        rss_end = _rss(run.daemon.pid)
        run.daemon.stop()
        run.check_log()
    finally:
        run.daemon.close()
    result = _figures(root, inputs, run)
    result.rss_bytes = (rss_ready, rss_end)
    result.seconds = round(time.monotonic() - started, 1)
    return result


class _Run:
    """The daemon of a campaign (restarted or replaced as it goes) and what it has done so far."""

    def __init__(self, root: Path, config: Path, deadline_s: float) -> None:
        self.root = root
        self.config = config
        self.deadline_s = deadline_s
        self.daemon: DaemonProcess
        self.lives: list[DaemonProcess] = []
        self.dropped: dict[int, float] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, int] = {}
        self.deaths = 0
        self.restarts = 0
        self.cancelled: dict[int, str] = {}
        self.stuck: dict[int, str] = {}
        self.problems: list[str] = []

    def start(self) -> None:
        self.daemon = DaemonProcess(self.config)
        self.lives.append(self.daemon)
        self.daemon.ready(timeout=120)
        recovered = self.daemon.events("journal.recovered")
        if recovered and recovered[0].get("unrecoverable"):
            self.problems.append(f"restart {self.restarts}: {recovered[0]}")

    def restart(self, *, kill: bool) -> None:
        if kill:
            self.daemon.kill9()
        else:
            status = self.daemon.stop(timeout=120)
            if status != 0:
                self.problems.append(f"SIGTERM ended the daemon with {status}")
        self.daemon.close()
        self.restarts += 1
        self.start()

    def poll(self, inputs: list[Input]) -> None:
        self.daemon.pump(0.5)
        if self.daemon.proc.poll() is not None:  # it died: a finding; the campaign goes on
            self.deaths += 1
            self.problems.append(
                f"the daemon died ({self.daemon.proc.returncode}):\n{self.daemon.tail()}"
            )
            self.daemon.close()
            self.start()
        self._read_journal()
        now = time.time()
        for item in inputs:
            if not item.job or self._ended(item.index) or item.index in self.stuck:
                continue
            record = self._record(item.index)
            if record is not None:
                waited = now - _epoch(record["created"])  # since its claim
            else:  # not claimed yet: it may wait its turn behind others; give it twice as long
                waited = (time.monotonic() - self.dropped[item.index]) / 2
            if waited > self.deadline_s:
                self._stuck(item, record)

    def unfinished(self, inputs: list[Input]) -> int:
        self._read_journal()
        return sum(
            1 for i in inputs if i.job and not self._ended(i.index) and i.index not in self.stuck
        )

    def _stuck(self, item: Input, record: dict[str, Any] | None) -> None:
        what = f"{token_of(item.index)} ({item.kind}: {item.detail}; {record['state'] if record else 'not claimed'})"
        self.stuck[item.index] = what
        if item.kind in KNOWN and record is not None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sharderd.cli",
                    "cancel",
                    record["job_id"],
                    "--config",
                    str(self.config),
                ],
                capture_output=True,
                timeout=60,
                check=False,
                env=self.daemon.env,
            )
            self.cancelled[item.index] = what

    def _ended(self, index: int) -> bool:
        record = self._record(index)
        return record is not None and record["state"] in _TERMINAL

    def _record(self, index: int) -> dict[str, Any] | None:
        return self.records.get(token_of(index))

    def _read_journal(self) -> None:
        journal = self.root / "state" / "journal"
        with contextlib.suppress(FileNotFoundError), os.scandir(journal) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.endswith(".json"):
                    continue
                mtime = entry.stat().st_mtime_ns
                if self._seen.get(entry.name) == mtime:
                    continue
                try:
                    record = json.loads(Path(entry.path).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                self._seen[entry.name] = mtime
                match = _TOKEN.search(str(record.get("name", "")))
                if match is None:
                    self.problems.append(f"a journal record names no input: {record.get('name')!r}")
                    continue
                previous = self.records.get(match.group(0))
                if previous is not None and previous["job_id"] != record["job_id"]:
                    self.problems.append(
                        f"{match.group(0)} became two jobs: {previous['job_id']}, {record['job_id']}"
                    )
                self.records[match.group(0)] = record

    def check_log(self) -> None:
        for life in self.lives:
            for line in life.lines:
                if line.get("event") == "<not json>":
                    self.problems.append(f"a log line is not JSON: {line['raw'][:200]}")
                elif line.get("event") == "daemon.error":
                    self.problems.append(
                        f"daemon.error: {line.get('message')} {line.get('error', '')}"
                    )
                elif line.get("event") == "watch.failed":
                    self.problems.append(f"watch.failed: {line.get('error')}")


def _figures(root: Path, inputs: list[Input], run: _Run) -> CampaignResult:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    latencies = []
    result = CampaignResult(len(inputs), sum(i.job for i in inputs), {})
    for item in inputs:
        by_kind[item.kind]["inputs"] += 1
        label = f"{token_of(item.index)} ({item.kind}: {item.detail})"
        if not item.job:
            untouched = all(os.path.lexists(root / "inbox" / e.name) for e in item.entries)
            by_kind[item.kind]["left alone"] += 1
            if not untouched or token_of(item.index) in run.records:
                result.problems.append(f"{label} is no job but was taken from the inbox")
            continue
        record = run.records.get(token_of(item.index))
        if record is None or record["state"] not in _TERMINAL:
            result.problems.append(f"{label} never ended ({record and record['state']})")
            continue
        state = record["state"]
        error = record.get("error") or {}
        reason = error.get("reason")
        by_kind[item.kind][f"failed: {reason}" if state == "failed" else state] += 1
        if _is_bug(error):
            (result.known_internal if item.kind in KNOWN else result.internal_errors).append(
                f"{label}: {str(error.get('message'))[:300]}"
            )
        if item.kind == "valid" and state not in ("succeeded", "duplicate"):
            result.problems.append(f"{label} is a valid model but ended {state} ({reason})")
        if item.index not in run.cancelled:
            latencies.append(_epoch(record["updated"]) - _epoch(record["created"]))
    state = root / "state"
    leftovers = [p for p in (root / "outbox").glob(".tmp-*")] + list(
        (state / "processing").iterdir()
    )
    result.problems += [f"left behind: {p}" for p in leftovers] + run.problems
    result.by_kind = {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())}
    result.deaths = run.deaths
    result.restarts = run.restarts
    result.stuck = [w for i, w in sorted(run.stuck.items()) if i not in run.cancelled]
    result.known_stuck = [w for _, w in sorted(run.cancelled.items())]
    if latencies:
        ordered = sorted(latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        result.latency_s = (
            round(statistics.median(ordered), 2),
            round(p99, 2),
            round(ordered[-1], 2),
        )
    return result


def _is_bug(error: dict[str, Any]) -> bool:
    """A failure sharderd calls its own bug, or a planning worker that died of a Python error (its
    traceback is the message: ``WorkerDiedError`` with an exit status, reason ``error``)."""
    message = str(error.get("message", ""))
    return error.get("reason") == "internal_error" or (
        error.get("reason") == "error"
        and message.startswith("the planning worker died (exit status")
    )


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
