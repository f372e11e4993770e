"""Recovery never stops start-up: ``sharderd run`` on a state folder holding each kind of broken
state an earlier run (or a disk, or a person) can leave; it starts, files what it cannot recover
under ``failed/`` with its reason and a log line, and goes on publishing new jobs.

The states are written the way the daemon of 31e16b4 left them (its journal writes a name that is
not UTF-8 as ``\\udcXX`` JSON escapes), or the way a damaged disk would.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import chain_model, drop, results, running, save_model, staged, write_config
from daemon_served import serving

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)


def _job(root: Path, job_id: str, entry: bytes, data: bytes) -> Path:
    """``processing/<job_id>/<entry>`` as a claim leaves it."""
    folder = root / "state" / "processing" / job_id
    folder.mkdir(parents=True)
    (folder / os.fsdecode(entry)).write_bytes(data)
    return folder


def _record(root: Path, job_id: str, text: str | None = None, **fields: Any) -> Path:
    """``journal/<job_id>.json``: ``text`` as is, else a record of ``fields``."""
    path = root / "state" / "journal" / f"{job_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"job_id": job_id, "attempts": 1, "priority": 0, "created": "", "updated": "", **fields}
    path.write_text(text if text is not None else json.dumps(body), encoding="utf-8")
    return path


def _model(seed: int) -> bytes:
    return save_model(
        chain_model(seed), Path(f"/tmp/sharderd-recovery-{os.getpid()}-{seed}.onnx")
    ).read_bytes()


JOB = "20250101T000000000Z-0000000{}"


def _latin1_failed(root: Path) -> str:
    """The issue's state: a latin-1 name, failed, its error.md torn by the encode error."""
    job = _job(root, JOB.format(1), b"\xe9t\xe9.onnx", _model(1))
    (job / "error.md").write_bytes(b"")
    error = {"reason": "internal_error", "message": "surrogates not allowed", "exit_code": 1}
    _record(root, job.name, name=os.fsdecode(b"\xe9t\xe9"), state="failed", error=error)
    return job.name


def _latin1_planning(root: Path) -> str:
    """The same kind of name, unfinished: it runs again and is published."""
    _job(root, JOB.format(2), b"caf\xe9.onnx", _model(2))
    _record(root, JOB.format(2), name=os.fsdecode(b"caf\xe9"), state="planning")
    return JOB.format(2)


def _torn_record(root: Path) -> str:
    """A record cut short by a disk, not by sharderd (its writes are temp file + rename)."""
    job = _job(root, JOB.format(3), b"torn.onnx", _model(3))
    _record(root, job.name, text=f'{{"job_id": "{job.name}", "na')
    return job.name


def _unreadable_record(root: Path) -> str:
    """A record that cannot be read at all: a folder where the file should be."""
    job = _job(root, JOB.format(4), b"odd.onnx", _model(4))
    (root / "state" / "journal").mkdir(parents=True, exist_ok=True)
    (root / "state" / "journal" / f"{job.name}.json").mkdir()
    return job.name


def _mistyped_record(root: Path) -> str:
    """Valid JSON, fields of the wrong type (an error that is no mapping, a priority in words)."""
    job = _job(root, JOB.format(5), b"typed.onnx", _model(5))
    _record(root, job.name, name="typed", state="failed", error=5, priority="high")
    return job.name


def _result_not_a_folder(root: Path) -> str:
    """Missing files: a succeeded record whose result folder is a file now."""
    job = _job(root, JOB.format(6), b"gone.onnx", _model(6))
    (root / "outbox").mkdir(parents=True, exist_ok=True)
    (root / "outbox" / "gone").write_text("someone replaced the result folder with a file")
    _record(root, job.name, name="gone", state="succeeded", result=str(root / "outbox" / "gone"))
    return job.name


def _model_gone(root: Path) -> str:
    """Missing files: a job folder left with its sidecar only."""
    _job(root, JOB.format(7), b"empty.toml", b"devices = 2\n")
    _record(root, JOB.format(7), name="empty", state="compiling")
    return JOB.format(7)


def _folder_gone(root: Path) -> str:
    """Missing files: a record whose processing folder is gone."""
    _record(root, JOB.format(8), name="vanished", state="compiling")
    return JOB.format(8)


KINDS: dict[str, tuple[Callable[[Path], str], str | None, str]] = {
    # kind: (make it, its folder in failed/ (None: published), its reason)
    "latin-1 name, failed": (_latin1_failed, "%E9t%E9", "internal_error"),
    "latin-1 name, planning": (_latin1_planning, None, "succeeded"),
    "torn record": (_torn_record, "torn", "unrecoverable"),
    "unreadable record": (_unreadable_record, "odd", "unrecoverable"),
    "mistyped record": (_mistyped_record, "typed", "unrecoverable"),
    "result not a folder": (_result_not_a_folder, "gone", "unrecoverable"),
    "model gone": (_model_gone, "empty", "bad_job"),
    "folder gone": (_folder_gone, None, "lost"),
}


def _check(root: Path, job_id: str, folder: str | None, reason: str) -> None:
    """The job ended as ``reason``: in ``failed/<folder>`` with error.json, or published, or lost;
    its journal record is readable and terminal; nothing is left in ``processing/``."""
    record = json.loads((root / "state" / "journal" / f"{job_id}.json").read_text())
    assert record["state"] == ("succeeded" if reason == "succeeded" else "failed")
    if folder is not None:
        error = json.loads((root / "state" / "failed" / folder / "error.json").read_bytes())
        assert error["reason"] == reason and error["job_id"] == job_id
    if reason == "unrecoverable" and record.get("error") is None:
        raise AssertionError(record)
    assert list((root / "state" / "processing").iterdir()) == []


@pytest.mark.anyio
@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_broken_state_is_filed_and_the_daemon_starts(root: Path, kind: str) -> None:
    """The daemon starts (``ready``) and files the job (its reason, a log line) or finishes it."""
    make, folder, reason = KINDS[kind]
    job_id = make(root)
    async with serving(write_config(root)) as daemon:
        if reason != "succeeded":
            [line] = daemon.events("job.failed", job_id=job_id)
            assert line["reason"] == reason
        else:
            await daemon.wait_for("job.succeeded", job_id=job_id, timeout=120)
    _check(root, job_id, folder, reason)
    if kind in ("torn record", "unreadable record"):  # kept for a look, never read again
        assert (root / "state" / "journal" / f"{job_id}.json.unreadable").exists()


def test_all_broken_states_at_once_in_a_real_process(root: Path) -> None:
    """Every kind in one state folder, ``sharderd run`` as a process: it starts and sorts out each."""
    made = {kind: make(root) for kind, (make, _, _) in KINDS.items()}
    staged(root, "after")
    with running(write_config(root)) as daemon:
        drop(root / "models" / "after.onnx", root / "inbox")
        daemon.wait_for("job.succeeded", count=2, timeout=120)
        recovered = daemon.events("journal.recovered")[0]
        assert (recovered["unrecoverable"], recovered["lost"]) == (3, 1)
    for kind, (_, folder, reason) in KINDS.items():
        _check(root, made[kind], folder, reason)
    assert (
        root / "state" / "failed" / "%E9t%E9" / os.fsdecode(b"\xe9t\xe9.onnx")
    ).read_bytes() == _model(1)


@pytest.mark.parametrize("where", ["retired", "in processing"])
def test_a_succeeded_record_the_index_lacks_is_indexed_again(root: Path, where: str) -> None:
    """The state a daemon before this one could leave (it journaled ``succeeded`` before it wrote
    the index): its job retired to ``done/``, or still in ``processing/``. At the next start the
    content is indexed again, so the same bytes dropped again are a duplicate, not a second result."""
    data = staged(root, "first").read_bytes()
    config = write_config(root)
    with running(config) as daemon:
        drop(root / "models" / "first.onnx", root / "inbox")
        [line] = daemon.wait_for("job.succeeded", timeout=120)
    for entry in (root / "state" / "index").iterdir():
        entry.unlink()
    if where == "in processing":
        job_dir = root / "state" / "processing" / line["job_id"]
        (root / "state" / "done" / "first").rename(job_dir)
        for report in job_dir.glob("report.*"):
            report.unlink()
    (root / "models" / "again.onnx").write_bytes(data)
    with running(config) as daemon:
        assert daemon.events("journal.recovered")[0]["reindexed"] == (where == "retired")
        drop(root / "models" / "again.onnx", root / "inbox")
        [duplicate] = daemon.wait_for("job.duplicate", timeout=120)
        assert duplicate["original_job_id"] == line["job_id"]
    assert [p.name for p in results(root / "outbox")] == ["first"]
