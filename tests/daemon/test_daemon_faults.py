"""Faults a running daemon must survive: ``kill -9`` at random moments, a full disk, an unwritable
outbox, and a burst of small models with inotify events lost. Nothing is lost, nothing runs twice.

The kill loop, the burst (the daemon's RSS) and the unwritable outbox (the daemon as another
user) drive a real ``sharderd run`` process (``tests/daemon_helpers.py``); the rest run the service
in the test's own event loop (``tests/daemon_served.py``). CI sizes by default;
the kill loop's and the burst's tests are in ``test_daemon_soak.py`` (``SHARDERD_SOAK=1`` adds the
full-size kill loop and ``SHARDERD_SLOW=1`` the 1,000-model burst).
``bench/daemon_soak.py`` runs both at full size and prints the table in BENCHMARKS.md. The kill loop
and the burst are plain functions here (``kill_loop``, ``burst``) so that script can call them.

What "exactly once" means, checked by ``check_exactly_once`` against the folders and the journal:
one journal record per job, every one terminal; every ``succeeded`` record owns exactly one outbox
folder (its ``.sharderd-job`` marker names it) and the outbox holds nothing else; a ``duplicate``
points at a ``succeeded`` result with the same content key; each input sits in ``done/`` once, with
its original bytes; nothing is left in ``inbox/``, ``processing/``, or under a temp name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from corpus import MODEL_CASES, SIDECAR_CASES, small_model
from daemon_helpers import (
    DaemonProcess,
    chain_model,
    drop,
    marked_processes,
    pointers,
    results,
    running,
    save_model,
    write_config,
)
from daemon_served import serving

from sharderd import examples
from sharderd.config import DaemonConfig
from sharderd.daemon.intake import inspect_entry
from sharderd.daemon.sidecar import load_sidecar
from sharderd.errors import ConfigError
from sharderd.filenames import safe_name

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

INOTIFY_QUEUE = Path("/proc/sys/fs/inotify/max_queued_events")
LOWERED_QUEUE = 16
"""Events the daemon's inotify instance may hold before the kernel drops the rest (IN_Q_OVERFLOW)."""
FLAT_RSS_BYTES = 50 * 1024 * 1024
""""Flat" memory: after the burst the daemon's RSS is at most this much above its RSS at ready."""
NOBODY = 65534
_RESULT_SKIP = ("report.json", "report.md", "report.html", ".sharderd-job")
"""Result files that legitimately differ between runs (timestamps, job ids)."""


# --- shared checks ----------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def journal_records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root / "state" / "journal").glob("*.json"))]


def temp_leftovers(root: Path) -> list[Path]:
    """Names only an interrupted write leaves: ``*.tmp``, ``.tmp-*`` (outbox), ``.work`` (attempts)."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.name.endswith(".tmp") or p.name.startswith(".tmp-") or p.name == ".work"
    )


def result_files(folder: Path) -> dict[str, bytes]:
    """A result's files that must be byte-identical for identical inputs, keyed without the job's stem."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in _RESULT_SKIP:
            rel = path.relative_to(folder).as_posix()
            stem, _, rest = rel.partition(".")
            files[rest if "/" not in stem else rel] = path.read_bytes()
    return files


def check_exactly_once(
    root: Path, sources: Mapping[str, str], *, allow_failed: Mapping[str, str] = {}
) -> dict[str, dict[str, Any]]:
    """Assert the end state described in the module docstring; returns the journal record per job name.

    ``sources`` maps each job name to the sha256 of its input model; ``allow_failed`` names jobs
    expected in ``failed/`` and a fragment of their message.
    """
    # the daemon names a job by its entry's safe_name (a newline as %0A): so do its folders
    sources = {safe_name(name): digest for name, digest in sources.items()}
    allow_failed = {safe_name(name): fragment for name, fragment in allow_failed.items()}
    state = root / "state"
    records = journal_records(root)
    names, expected = Counter(r["name"] for r in records), Counter(list(sources))
    assert names == expected, (
        f"journal names differ from the jobs: extra {names - expected}, missing {expected - names}"
    )
    by_name = {r["name"]: r for r in records}
    assert all(r["state"] in ("succeeded", "duplicate", "failed") for r in records), [
        r for r in records if r["state"] not in ("succeeded", "duplicate", "failed")
    ]
    owners = {}
    for r in records:
        if r["state"] == "succeeded":
            result = Path(r["result"])
            assert result.parent == root / "outbox", r
            assert (result / ".sharderd-job").read_text().strip() == r["job_id"], r
            assert result not in owners, (
                f"{result} published by {owners.get(result)} and {r['job_id']}"
            )
            owners[result] = r["job_id"]
    assert set(results(root / "outbox")) == set(owners), (
        "outbox folders without a succeeded job (or missing)"
    )
    succeeded = {r["result"]: r for r in records if r["state"] == "succeeded"}
    duplicates = {}
    for r in records:
        if r["state"] == "duplicate":
            original = succeeded.get(r["result"])
            assert original is not None and original["sha256"] == r["sha256"], r
            duplicates[r["job_id"]] = r["result"]
    pointed = {
        (p / ".sharderd-job").read_text().strip(): json.loads((p / "duplicate.json").read_text())[
            "duplicate_of"
        ]["result"]
        for p in pointers(root / "outbox")
    }
    assert pointed == duplicates, (
        "each duplicate has exactly one outbox pointer, at its first result"
    )
    failed = {r["name"]: r for r in records if r["state"] == "failed"}
    assert set(failed) == set(allow_failed), {n: r["error"] for n, r in failed.items()}
    for name, fragment in allow_failed.items():
        assert fragment in failed[name]["error"]["message"], failed[name]["error"]
        assert Path(failed[name]["result"]) == state / "failed" / name
    assert sorted(p.name for p in (state / "failed").iterdir()) == sorted(allow_failed)
    assert sorted(p.name for p in (state / "done").iterdir()) == sorted(
        set(sources) - set(allow_failed)
    )
    kept = {}  # content -> the one input done/ (or failed/) keeps of it
    for name, digest in sources.items():
        folder = state / ("failed" if name in allow_failed else "done") / name
        if by_name[name]["state"] == "duplicate":  # its bytes are the original's, kept there
            assert not any(folder.glob("*.onnx")) and not any(folder.glob("*/*.onnx")), folder
            continue
        model = (
            folder / f"{name}.onnx"
            if (folder / f"{name}.onnx").exists()
            else next(folder.glob("*/*.onnx"))
        )
        assert sha256(model) == digest, f"the input of {name} changed"
        kept[digest] = name
    assert set(kept) == set(sources.values()), "some content is kept nowhere"
    for entry in (state / "index").glob("*.json"):
        index = json.loads(entry.read_text())
        assert (
            Path(index["result"]) in owners
            and succeeded[index["result"]]["sha256"] == index["sha256"]
        ), index
    assert list((root / "inbox").iterdir()) == []
    assert list((state / "processing").iterdir()) == []
    assert temp_leftovers(root) == []
    return by_name


def all_terminal(root: Path, count: int) -> bool:
    """The journal holds ``count`` terminal records and nothing is pending."""
    with contextlib.suppress(OSError, ValueError):
        records = journal_records(root)
        return (
            len(records) == count
            and all(r["state"] in ("succeeded", "duplicate", "failed") for r in records)
            and not any((root / "inbox").iterdir())
            and not any((root / "state" / "processing").iterdir())
        )
    return False


def wait_all_terminal(daemon: DaemonProcess, root: Path, count: int, timeout: float) -> None:
    """Read the daemon's log until ``all_terminal``."""
    daemon.wait_until(
        lambda: all_terminal(root, count), timeout, f"{count} jobs to reach a terminal state"
    )


def no_processes_left(daemons: Sequence[DaemonProcess], timeout: float = 10.0) -> None:
    """Every process any of these daemons started is gone (an orphaned planning worker exits on EOF)."""

    def left() -> list[int]:
        return [pid for d in daemons for pid in marked_processes(d.token)]

    with contextlib.suppress(AssertionError):
        daemons[-1].wait_until(lambda: not left(), timeout, "the daemons' processes to exit")
    assert left() == [], f"processes left behind: {left()}"


def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of ``pid`` from ``/proc/PID/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


# --- the bad-input corpus, through one daemon -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CorpusResult:
    entries: int
    """Inbox entries dropped (a model with its sidecar counts once)."""
    jobs: int
    """Entries the intake takes as jobs; the rest (a folder without a model...) stay in the inbox."""
    failed: int
    succeeded: int
    """Valid inputs among them (names, options the CLI refuses but the daemon's defaults accept)."""
    daemon_deaths: int
    lost: int
    reasons: dict[str, int]
    internal_errors: list[str]
    """Cases whose job failed as a sharderd bug (``internal_error``)."""


def corpus_entries(staging: Path, skip: frozenset[str] = frozenset()) -> list[list[Path]]:
    """Every case of ``tests/corpus.py`` as inbox entries in ``staging``, named ``<case>-<name>``;
    each item is what one drop renames in (a sidecar before its model). A sidecar case gets a valid
    model beside it; what is not a model, sidecar or folder (a file a case links to) stays behind."""
    build = staging.parent / f"{staging.name}-build"
    staging.mkdir(parents=True)
    cases: dict[str, Any] = {k: c.build for k, c in MODEL_CASES.items()} | {
        f"sidecar-{k}": b for k, b in SIDECAR_CASES.items()
    }
    entries = []
    for key, builder in cases.items():
        if key in skip:
            continue
        folder = build / key
        folder.mkdir(parents=True)
        builder(folder)
        for toml in folder.glob("*.toml"):
            if not toml.with_suffix(".onnx").exists():
                toml.with_suffix(".onnx").write_bytes(small_model().SerializeToString())
        for entry in sorted(folder.iterdir()):
            if entry.suffix == ".onnx" or entry.is_dir():
                group = [entry.with_suffix(".toml")] if entry.with_suffix(".toml").exists() else []
                moved = [p.rename(staging / f"{key}-{p.name}") for p in [*group, entry]]
                entries.append(moved)
    return entries


def corpus_through_daemon(root: Path, skip: frozenset[str] = frozenset()) -> CorpusResult:
    """Drop the whole corpus into one daemon: it never dies, every job ends once (``failed/`` with a
    reason, or a result), non-jobs stay untouched in the inbox, and a good job after them succeeds."""
    groups = corpus_entries(root / "staging", skip)
    is_job = {g[-1].name: inspect_entry(root / "staging", g[-1].name) is not None for g in groups}
    names = {safe_name(g[-1].name.removesuffix(".onnx")) for g in groups if is_job[g[-1].name]}
    good = save_model(chain_model(99), root / "good.onnx")

    def settled() -> bool:
        with contextlib.suppress(OSError, ValueError):
            records = journal_records(root)
            return (
                len(records) >= len(names)
                and all(r["state"] in ("succeeded", "duplicate", "failed") for r in records)
                and not any((root / "state" / "processing").iterdir())
            )
        return False

    async def run() -> int:
        """The service in this loop; 1 when it stopped before it was told to (a death)."""
        async with serving(write_config(root)) as daemon:
            for group in groups:
                for path in group:
                    drop(path, root / "inbox")
            await daemon.wait_until(settled, 120 + 5 * len(names), f"{len(names)} corpus jobs")
            drop(good, root / "inbox")
            await daemon.wait_for("job.succeeded", name="good", timeout=60)
            return int(daemon.stopped.is_set())

    deaths = anyio.run(run)
    records = {r["name"]: r for r in journal_records(root)}
    assert set(records) == names | {"good"}, set(records) ^ (names | {"good"})
    failed = root / "state" / "failed"
    for name, record in records.items():
        if record["state"] == "failed":
            error = json.loads((failed / name / "error.json").read_text())
            assert error["message"] and error["reason"] == record["error"]["reason"], (name, error)
        else:
            assert (root / "state" / "done" / name).exists(), name
    left = sorted(p.name for p in (root / "inbox").iterdir())
    assert left == sorted(n for n, job in is_job.items() if not job)
    reasons = Counter(str(r["error"]["reason"]) for r in records.values() if r["state"] == "failed")
    bugs = sorted(
        _case_of(n)
        for n, r in records.items()
        if r["state"] == "failed" and r["error"]["reason"] == "internal_error"
    )
    return CorpusResult(
        len(groups),
        len(names),
        sum(reasons.values()),
        len(records) - 1 - sum(reasons.values()),
        deaths,
        len(names) - (len(records) - 1),
        dict(sorted(reasons.items())),
        bugs,
    )


def _case_of(job_name: str) -> str:
    """The corpus case a job came from: the longest case key its name starts with."""
    keys = [*MODEL_CASES, *(f"sidecar-{k}" for k in SIDECAR_CASES)]
    return max((k for k in keys if job_name.startswith(f"{k}-")), key=len)


def test_every_corpus_input_through_one_daemon(tmp_path: Path) -> None:
    """The bad-input corpus dropped at once: the daemon never dies, each job ends exactly once with a
    reason, and it still publishes a good job afterwards (the 10 GiB sparse case: full size only)."""
    outcome = corpus_through_daemon(tmp_path, skip=frozenset({"sparse-10gb"}))
    assert outcome.daemon_deaths == 0 and outcome.lost == 0
    assert outcome.jobs >= 40 and outcome.failed >= 30, outcome
    known_bugs = {key for key, case in MODEL_CASES.items() if case.bug}
    assert set(outcome.internal_errors) <= known_bugs, outcome  # only the corpus's reported bugs


# --- the kill -9 loop ---------------------------------------------------------------------------------

Kind = Literal["plain", "poprt", "folder"]
_PATTERN: tuple[tuple[Kind, int | None], ...] = (
    ("plain", None),
    ("poprt", None),
    ("plain", None),
    ("plain", 0),
    ("folder", None),
    ("plain", None),
    ("poprt", 1),
    ("plain", None),
    ("poprt", None),
    ("plain", 2),
    ("plain", None),
    ("folder", 4),
)
"""One cycle of soak jobs: ``(kind, index of the job in this cycle it duplicates)``. ``poprt`` and
``folder`` jobs compile on the fake PopRT (a folder job holds external data, so its attempts
hard-link it), which is what puts kills in the middle of attempts."""


@dataclass(frozen=True, slots=True)
class SoakJob:
    name: str
    kind: Kind
    seed: int
    """Jobs with equal ``(kind, seed)`` have identical content."""

    @property
    def content(self) -> tuple[Kind, int]:
        return self.kind, self.seed


def soak_jobs(count: int) -> list[SoakJob]:
    """``count`` jobs cycling through ``_PATTERN``; about a quarter duplicate an earlier job's content."""
    jobs: list[SoakJob] = []
    for k in range(count):
        cycle, pos = divmod(k, len(_PATTERN))
        kind, same_as = _PATTERN[pos]
        seed = 1000 * cycle + (pos if same_as is None else same_as)
        jobs.append(SoakJob(f"j{k:03d}", kind, seed))
    return jobs


def stage(job: SoakJob, folder: Path) -> tuple[list[Path], str]:
    """Write ``job`` under ``folder``; returns the paths to rename into the inbox (sidecar first) and
    the sha256 of its model."""
    if job.kind == "folder":
        model = save_model(
            chain_model(job.seed, hidden=32), folder / job.name / "net.onnx", external_data=True
        )
        (folder / job.name / "sharderd.toml").write_text('backend = "poprt"\n')
        return [folder / job.name], sha256(model)
    model = save_model(chain_model(job.seed), folder / f"{job.name}.onnx")
    if job.kind == "plain":
        return [model], sha256(model)
    sidecar = folder / f"{job.name}.toml"
    sidecar.write_text('backend = "poprt"\n')
    return [sidecar, model], sha256(model)


def soak_config(root: Path, **daemon: Any) -> Path:
    """Backend none by default (a sidecar asks for poprt), two compiles at once, fast settle and rescan."""
    return write_config(root, target="ipu-mk2", max_parallel_compiles=2, **daemon)


def reference_results(
    root: Path, jobs: Sequence[SoakJob]
) -> dict[tuple[Kind, int], dict[str, bytes]]:
    """What a clean run (no kills, instant compiles) publishes for each distinct content."""
    first = {job.content: job for job in reversed(jobs)}
    staged = {job.name: stage(job, root / "models")[0] for job in first.values()}

    async def run() -> None:
        env = {"FAKE_POPRT_COMPILE_SECONDS": "0"}
        async with serving(soak_config(root), fake_poprt=True, env=env) as daemon:
            for paths in staged.values():
                for path in paths:
                    drop(path, root / "inbox")
            await daemon.wait_until(
                lambda: all_terminal(root, len(first)), 60 + 5 * len(first), "the clean run"
            )

    anyio.run(run)
    records = {r["name"]: r for r in journal_records(root)}
    assert all(r["state"] == "succeeded" for r in records.values()), records
    return {
        content: result_files(Path(records[job.name]["result"])) for content, job in first.items()
    }


@dataclass(frozen=True, slots=True)
class KillLoopResult:
    jobs: int
    distinct: int
    kills: int
    kills_mid_attempt: int
    """Kills that landed while a compile attempt was running (``attempt.started`` not yet finished)."""
    attempts_started: int
    succeeded: int
    duplicates: int
    failed: int
    seconds: float


def kill_loop(
    root: Path,
    jobs: Sequence[SoakJob],
    *,
    kills: int,
    seed: int,
    compile_seconds: float = 1.5,
    reference: bool = True,
) -> KillLoopResult:
    """Drop ``jobs`` over ``kills + 1`` daemon lives, ``kill -9`` each but the last at a seeded random
    moment, then check exactly-once, byte-identical results and that no process is left.

    The first kill waits for a compile attempt to start, so at least one lands mid-attempt; the
    others come 0.2-2 s after ``READY``. Odd rounds drop their batch while the daemon is down
    (found by the start-up scan), even rounds while it runs.
    """
    started = time.monotonic()
    expected = reference_results(root / "reference", jobs) if reference else None
    rng = random.Random(seed)
    staged = {job.name: stage(job, root / "models") for job in jobs}
    order = list(jobs)
    rng.shuffle(order)
    order.sort(
        key=lambda j: j.kind == "plain"
    )  # the first batch holds compiling jobs: kill 1 needs one
    batches = [order[r :: kills + 1] for r in range(kills + 1)]
    config = soak_config(root, max_attempts=kills + 8)  # a job killed in every round still succeeds
    env = {"FAKE_POPRT_COMPILE_SECONDS": str(compile_seconds)}
    daemons: list[DaemonProcess] = []
    mid_attempt = 0

    def drop_batch(batch: Sequence[SoakJob]) -> None:
        for job in batch:
            for path in staged[job.name][0]:
                drop(path, root / "inbox")

    try:
        for round_ in range(kills + 1):
            if round_ % 2:
                drop_batch(batches[round_])
            daemon = DaemonProcess(config, fake_poprt=True, env=env)
            daemons.append(daemon)
            daemon.ready()
            if round_ % 2 == 0:
                drop_batch(batches[round_])
            if round_ == kills:
                break
            # the kill's moment is the test's input: seeded random, not an event to await
            if round_ == 0:
                daemon.wait_for("attempt.started", timeout=60)
                daemon.pump(rng.uniform(0.0, min(0.5, compile_seconds / 2)))
            else:
                daemon.pump(rng.uniform(0.2, 2.0))
            running_attempts = len(daemon.events("attempt.started")) - len(
                daemon.events("attempt.finished")
            )
            mid_attempt += running_attempts > 0
            daemon.kill9()
            assert daemon.proc.returncode == -signal.SIGKILL
        final = daemons[-1]
        wait_all_terminal(final, root, len(jobs), timeout=120 + 10 * len(jobs))
        assert final.stop() == 0
        for daemon in daemons:
            daemon.check_log()
            assert "Traceback" not in daemon.stderr, daemon.stderr[-3000:]
        for daemon in daemons[1:]:
            assert daemon.events("journal.recovered")  # each restart sorted out what the kill left
        no_processes_left(daemons)
    finally:
        for daemon in daemons:
            daemon.close()
    records = check_exactly_once(root, {name: digest for name, (_, digest) in staged.items()})
    if expected is not None:
        for job in jobs:
            got = result_files(Path(records[job.name]["result"]))
            assert got == expected[job.content], f"{job.name}: result differs from a clean run's"
    for job in jobs:
        if job.kind != "plain":
            assert list(Path(records[job.name]["result"]).glob("*.popef")), job
    states = Counter(r["state"] for r in records.values())
    return KillLoopResult(
        jobs=len(jobs),
        distinct=len({j.content for j in jobs}),
        kills=kills,
        kills_mid_attempt=mid_attempt,
        attempts_started=sum(len(d.events("attempt.started")) for d in daemons),
        succeeded=states["succeeded"],
        duplicates=states["duplicate"],
        failed=states["failed"],
        seconds=round(time.monotonic() - started, 1),
    )


def test_kill_9_mid_attempt_of_a_folder_job_with_external_data_resumes_it(tmp_path: Path) -> None:
    """A compile attempt hard-links the job's external data; after kill -9 mid-attempt the restart
    clears the attempt folder first, so the links it left are not mistaken for a dropper's."""
    job = SoakJob("folder", "folder", 5)
    paths, digest = stage(job, tmp_path / "models")
    config = soak_config(tmp_path)
    first = DaemonProcess(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "30"})
    try:
        first.ready()
        drop(paths[0], tmp_path / "inbox")
        first.wait_for("attempt.started")
        data = next((tmp_path / "state" / "processing").glob("*/folder/net.data"))
        assert data.stat().st_nlink >= 2  # the attempt's link
        first.kill9()
        with running(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "0"}) as second:
            second.wait_for("job.succeeded", name="folder", timeout=60)
            assert second.stop() == 0
        no_processes_left([first])
    finally:
        first.close()
    check_exactly_once(tmp_path, {"folder": digest})


def test_a_daemon_max_attempts_above_the_sidecar_limit_applies_to_jobs_with_a_sidecar(
    tmp_path: Path,
) -> None:
    """``[daemon] max_attempts = 108`` (the 100-kill soak's) reaches a job whose sidecar sets only
    its priority; it used to fail every such job, blaming the sidecar for the daemon's value."""
    sidecar = tmp_path / "m.toml"
    sidecar.write_text("priority = 2\n")
    options = load_sidecar(sidecar, DaemonConfig(max_attempts=108, devices=2))
    assert (options.max_attempts, options.priority) == (108, 2)
    sidecar.write_text("max_attempts = 108\n")
    with pytest.raises(
        ConfigError, match=r"m\.toml: max_attempts must be between 1 and 100, got 108"
    ):
        load_sidecar(sidecar, DaemonConfig())


@pytest.mark.anyio
async def test_restart_sweeps_the_temp_files_a_kill_leaves_mid_write(tmp_path: Path) -> None:
    """Temp files of a journal write, an index write and a result cut short by kill -9 are gone
    once a restarted daemon is ready; no job comes of them."""
    config = soak_config(tmp_path)
    state = tmp_path / "state"
    planted = [
        state / "journal" / ".20250101T000000000Z-0000aaaa.json.1a2b3c4d.tmp",
        state / "index" / f".{'0' * 64}.json.1a2b3c4d.tmp",
        tmp_path / "outbox" / ".tmp-20250101T000000000Z-0000aaaa" / "half.sharded.onnx",
    ]
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{")
    async with serving(config):
        pass  # ready: start-up (the recovery) is over
    assert temp_leftovers(tmp_path) == [] and journal_records(tmp_path) == []
    assert not any(p.exists() for p in planted)


# --- disk full, permission denied ---------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of our own: filling it gives every writer in the daemon a real ENOSPC."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "sharderd-test", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, *, leave: int = 0) -> Path:
    """Take all but ``leave`` bytes of the filesystem with one ballast file."""
    ballast = mount / "ballast"
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with open(ballast, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


def free_bytes(mount: Path) -> int:
    st = os.statvfs(mount)
    return st.f_bavail * st.f_frsize


@pytest.mark.anyio
async def test_disk_full_jobs_wait_in_processing_and_finish_once_space_returns(
    small_fs: Path,
) -> None:
    """With the disk full the daemon keeps running, the claimed inputs stay intact in processing/ and
    are retried at each rescan; once space is freed both finish, exactly once, without a restart."""
    root = small_fs / "daemon"
    models = {
        name: save_model(chain_model(seed, hidden=16), root / "models" / f"{name}.onnx")
        for seed, name in enumerate(("a", "b"))
    }
    sources = {name: sha256(path) for name, path in models.items()}
    async with serving(write_config(root, rescan_interval=0.5)) as daemon:
        ballast = fill(small_fs)
        assert free_bytes(small_fs) == 0
        for path in models.values():
            drop(path, root / "inbox")
        # Every claimed job fails to write its journal, is left in processing/, and is tried again.
        await daemon.wait_for("daemon.error", count=6, timeout=30)
        assert not daemon.stopped.is_set()
        assert all(
            "No space left on device" in json.dumps(ln) for ln in daemon.events("daemon.error")
        )
        claimed = {ln["name"] for ln in daemon.events("job.claimed")}
        assert claimed == {"a", "b"}
        for name, digest in sources.items():
            held = list((root / "state" / "processing").glob(f"*/{name}.onnx"))
            assert len(held) == 1 and sha256(held[0]) == digest
        assert results(root / "outbox") == [] and list((root / "state" / "failed").iterdir()) == []
        ballast.unlink()
        await daemon.wait_for("job.succeeded", count=2, timeout=30)
        # a status write with room again, so a stale temp file would show
        await daemon.wait_status(lambda s: s["queue"]["succeeded"] == 2, "2 succeeded")
        assert len(daemon.events("job.claimed")) == 2
    check_exactly_once(root, sources)
    assert [p.name for p in results(root / "outbox")] == ["a", "b"]


@pytest.mark.anyio
async def test_disk_too_full_for_the_result_fails_the_job_with_the_reason(small_fs: Path) -> None:
    """Room for the bookkeeping but not for the sharded model: the job fails naming ENOSPC, its input
    intact in failed/, and the daemon goes on to finish the next job once there is room."""
    root = small_fs / "daemon"
    big = save_model(chain_model(1, hidden=128), root / "models" / "big.onnx")  # ~1 MB of weights
    small = save_model(chain_model(2, hidden=8), root / "models" / "small.onnx")
    sources = {"big": sha256(big), "small": sha256(small)}
    async with serving(write_config(root)) as daemon:
        ballast = fill(small_fs, leave=256 * 1024)
        drop(big, root / "inbox")
        await daemon.wait_for("job.failed", name="big", timeout=30)
        assert not daemon.stopped.is_set()
        ballast.unlink()
        drop(small, root / "inbox")
        await daemon.wait_for("job.succeeded", name="small", timeout=30)
        # a status write with room again, so a stale temp file would show
        await daemon.wait_status(lambda s: s["queue"]["succeeded"] == 1, "1 succeeded")
    error = json.loads((root / "state" / "failed" / "big" / "error.json").read_text())
    assert error["reason"] != "internal_error", error
    check_exactly_once(root, sources, allow_failed={"big": "No space left on device"})


@contextlib.contextmanager
def unprivileged(uid: int = NOBODY) -> Iterator[None]:
    """Start subprocesses as ``uid`` with only ``CAP_DAC_READ_SEARCH`` (to read the interpreter and the
    repository wherever they are): writes get the kernel's real permission checks."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start the daemon as another user")
    popen = subprocess.Popen
    prefix = [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
    ]

    def as_user(argv: Sequence[str], *args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        return popen([*prefix, *argv], *args, **kwargs)

    subprocess.Popen = as_user  # type: ignore[assignment,misc]  # DaemonProcess builds its own Popen
    try:
        yield
    finally:
        subprocess.Popen = popen  # type: ignore[misc]


@pytest.fixture
def nobody_root() -> Iterator[Path]:
    """A folder owned by ``nobody`` on a path that user can reach (pytest's ``tmp_path`` is 0700 root):
    ``access()``, which the daemon's start-up checks use, ignores capabilities."""
    root = Path(tempfile.mkdtemp(prefix="sharderd-nobody-"))
    try:
        root.chmod(0o755)
        yield root / "daemon"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_outbox_permission_denied_fails_the_job_with_the_reason(nobody_root: Path) -> None:
    """The daemon's user loses write access to the outbox: the job fails naming it, the input stays
    intact in failed/, and once access is back the next job is published."""
    root = nobody_root
    first = save_model(chain_model(1), root / "models" / "first.onnx")
    second = save_model(chain_model(2), root / "models" / "second.onnx")
    sources = {"first": sha256(first), "second": sha256(second)}
    config = write_config(root)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(root)], check=True)
    with unprivileged():
        daemon = DaemonProcess(config)
    try:
        daemon.ready()
        assert Path(f"/proc/{daemon.pid}/status").read_text().count(f"\t{NOBODY}\t") >= 1
        (root / "outbox").chmod(0o555)
        drop(first, root / "inbox")
        failed = daemon.wait_for("job.failed", name="first")[0]
        assert "Permission denied" in failed["message"] and failed["reason"] != "internal_error", (
            failed
        )
        (root / "outbox").chmod(0o750)
        drop(second, root / "inbox")
        daemon.wait_for("job.succeeded", name="second")
        assert daemon.stop() == 0
        daemon.check_log()
    finally:
        daemon.close()
    check_exactly_once(root, sources, allow_failed={"first": "Permission denied"})
    readable = (root / "state" / "failed" / "first" / "error.md").read_text()
    assert "outbox" in readable and "Permission denied" in readable


# --- a burst of models ----------------------------------------------------------------------------


@contextlib.contextmanager
def inotify_queue(limit: int) -> Iterator[int | None]:
    """Lower ``fs.inotify.max_queued_events`` while the block starts a watcher; yields the old value,
    None when the knob is not writable here. The limit is read at ``inotify_init``, so it is
    restored as soon as the daemon's watcher exists (other watchers on the host keep theirs)."""
    try:
        old = int(INOTIFY_QUEUE.read_text())
        INOTIFY_QUEUE.write_text(f"{limit}\n")
    except OSError:
        yield None
        return
    try:
        yield old
    finally:
        INOTIFY_QUEUE.write_text(f"{old}\n")


@dataclass(frozen=True, slots=True)
class BurstResult:
    models: int
    distinct: int
    queue_limit: int | None
    """``max_queued_events`` the daemon's watcher got; None: the host's, unchanged."""
    detected_by_event: int
    """Jobs first seen through a watch event; the rest were found by the periodic rescan."""
    seconds: float
    rss_ready: int
    rss_end: int
    rss_peak: int
    """``VmHWM`` of the daemon: its peak RSS since start."""
    samples: list[int] = field(default_factory=list)


def burst(
    root: Path, count: int, *, distinct: int, queue_limit: int | None = LOWERED_QUEUE
) -> BurstResult:
    """Rename ``count`` small models (``examples.chain(nodes=8, hidden=4)``, ``distinct`` different
    contents) into the inbox at once; check each is processed exactly once and sample the RSS."""
    names = [f"b{k:04d}" for k in range(count)]
    blobs = [examples.chain(nodes=8, hidden=4, seed=k).SerializeToString() for k in range(distinct)]
    staging = root / "models"
    staging.mkdir(parents=True)
    sources = {}
    for k, name in enumerate(names):
        (staging / f"{name}.onnx").write_bytes(blobs[k % distinct])
        sources[name] = hashlib.sha256(blobs[k % distinct]).hexdigest()
    config = write_config(root, rescan_interval=2.0)
    with inotify_queue(queue_limit) if queue_limit else contextlib.nullcontext() as old:
        daemon = DaemonProcess(config)
        try:
            daemon.wait_for("watch.started", timeout=30)
        except BaseException:
            daemon.close()
            raise
    try:
        daemon.ready()
        daemon.pump(0.5)  # the test's input: start-up's allocations settle before the first sample
        samples = [rss_bytes(daemon.pid)]
        start = time.monotonic()
        for name in names:
            (staging / f"{name}.onnx").rename(root / "inbox" / f"{name}.onnx")

        def finished() -> bool:
            samples.append(rss_bytes(daemon.pid))
            return (
                len(daemon.events("job.succeeded")) + len(daemon.events("job.duplicate")) >= count
            )

        daemon.wait_until(finished, 60 + 2.0 * count, f"{count} jobs to finish")
        seconds = time.monotonic() - start
        daemon.pump(1.0)  # the test's input: the idle stretch after the burst, then the last sample
        samples.append(rss_bytes(daemon.pid))
        peak = rss_bytes(daemon.pid, "VmHWM")
        assert daemon.stop() == 0
        daemon.check_log()
        detected = daemon.events("job.detected")
        claimed = Counter(ln["name"] for ln in daemon.events("job.claimed"))
        assert claimed == Counter(names), claimed - Counter(names)
        assert not daemon.events("job.failed")
    finally:
        daemon.close()
    check_exactly_once(root, sources)
    assert len(results(root / "outbox")) == distinct
    return BurstResult(
        count,
        distinct,
        queue_limit if old is not None else None,
        sum(1 for ln in detected if ln.get("moved_in")),
        round(seconds, 1),
        samples[0],
        samples[-1],
        peak,
        samples,
    )
