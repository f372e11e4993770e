"""sharderd.daemon.journal: crash-safe records, the content index and restart recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sharderd.daemon.journal import JobRecord, Journal, recover
from sharderd.daemon.outbox import publish, tmp_dir_for

ROOT = Path(__file__).resolve().parents[2]
SHA_A = "a" * 64
SHA_B = "b" * 64


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


class TestRecords:
    def test_record_round_trip_with_stamps(self, tmp_path: Path) -> None:
        """A record reads back equal; ``created`` is kept and ``updated`` moves on rewrite."""
        clock = Clock()
        journal = Journal(tmp_path, now=clock)
        first = journal.record(
            JobRecord("J1", "bert", "claimed", sha256=SHA_A, error={"reason": "x"})
        )
        clock.t += 60
        second = journal.record(JobRecord(**{**_fields(first), "state": "compiling"}))
        assert journal.get("J1") == second
        assert (first.created, second.created) == (
            "2023-11-14T22:13:20.000Z",
            "2023-11-14T22:13:20.000Z",
        )
        assert second.updated == "2023-11-14T22:14:20.000Z"
        assert json.loads((tmp_path / "journal" / "J1.json").read_text())["state"] == "compiling"

    def test_bump_attempts_persists(self, tmp_path: Path) -> None:
        """Attempts counted by one journal instance are seen by the next (a restart)."""
        Journal(tmp_path).record(JobRecord("J1", "m", "compiling"))
        Journal(tmp_path).bump_attempts("J1")
        Journal(tmp_path).bump_attempts("J1")
        assert Journal(tmp_path).load_all()["J1"].attempts == 2
        with pytest.raises(KeyError):
            Journal(tmp_path).bump_attempts("nope")

    def test_torn_temp_file_is_ignored_and_swept(self, tmp_path: Path) -> None:
        """A temp file cut short by a crash leaves the committed record intact and is removed."""
        journal = Journal(tmp_path)
        journal.record(JobRecord("J1", "m", "claimed"))
        torn = tmp_path / "journal" / ".J1.json.deadbeef.tmp"
        torn.write_text('{"job_id": "J1", "name": "m", "state": "succ')
        records = journal.load_all()
        assert records["J1"].state == "claimed"
        assert not torn.exists()

    def test_corrupt_record_is_reported_not_fatal(self, tmp_path: Path) -> None:
        """An unreadable record is skipped and reported; the others still load."""
        journal = Journal(tmp_path)
        journal.record(JobRecord("J2", "ok", "claimed"))
        (tmp_path / "journal" / "J1.json").write_text("{not json")
        (tmp_path / "journal" / "J3.json").write_text(
            '{"job_id": "J3", "name": "x", "state": "exploded"}'
        )
        bad: list[str] = []
        assert list(journal.load_all(on_corrupt=lambda p, _why: bad.append(p.name))) == ["J2"]
        assert bad == ["J1.json", "J3.json"]

    def test_kill_9_mid_write_leaves_loadable_records(self, tmp_path: Path) -> None:
        """A writer SIGKILLed while rewriting records never leaves a torn ``<job_id>.json``."""
        script = (
            "import sys; from pathlib import Path\n"
            "from sharderd.daemon.journal import Journal, JobRecord\n"
            "j = Journal(Path(sys.argv[1])); big = {'tail': 'x' * 200_000}\n"
            "j.record(JobRecord('J1', 'm', 'claimed')); print('go', flush=True)\n"
            "for i in range(10**9): j.record(JobRecord('J1', 'm', 'compiling', attempts=i, error=big))\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
        while proc.poll() is None and len(list((tmp_path / "journal").iterdir())) < 2:
            pass  # until a temp file exists: the kill lands mid-write
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        record = Journal(tmp_path).load_all()["J1"]
        assert record.state in {"claimed", "compiling"}
        assert [p.name for p in (tmp_path / "journal").iterdir()] == ["J1.json"]


def _fields(record: JobRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


class TestIndex:
    def test_first_result_wins(self, tmp_path: Path) -> None:
        """The second job with the same content gets the first job's result back."""
        journal = Journal(tmp_path)
        (tmp_path / "out1").mkdir()
        first = journal.remember(SHA_A, tmp_path / "out1", "J1")
        second = journal.remember(SHA_A, tmp_path / "out2", "J2")
        assert second == first
        assert (first.result, first.job_id) == (str(tmp_path / "out1"), "J1")
        assert journal.lookup(SHA_B) is None
        assert [p.name for p in (tmp_path / "index").iterdir()] == [f"{SHA_A}.json"]

    def test_deleted_result_no_longer_counts(self, tmp_path: Path) -> None:
        """Once the original result folder is deleted, the next job becomes the original."""
        journal = Journal(tmp_path)
        (tmp_path / "out1").mkdir()
        journal.remember(SHA_A, tmp_path / "out1", "J1")
        (tmp_path / "out1").rmdir()
        assert journal.lookup(SHA_A) is None
        (tmp_path / "out2").mkdir()
        assert journal.remember(SHA_A, tmp_path / "out2", "J2").job_id == "J2"
        assert journal.lookup(SHA_A) is not None

    def test_bad_keys_refused(self, tmp_path: Path) -> None:
        """Keys and job ids become file names, so anything but their exact shape is refused."""
        journal = Journal(tmp_path)
        with pytest.raises(ValueError, match="64 lowercase hex"):
            journal.lookup("../../etc/passwd")
        with pytest.raises(ValueError, match="bad job id"):
            journal.get("../x")


class TestRecover:
    def test_sorts_every_processing_folder_once(self, tmp_path: Path) -> None:
        """Each job folder lands in exactly one of resume / to_fail / finish; leftovers are swept."""
        state, outbox = tmp_path / "state", tmp_path / "outbox"
        outbox.mkdir()
        journal = Journal(state)
        proc = state / "processing"

        def job(job_id: str, name: str, record: JobRecord | None) -> None:
            (proc / job_id).mkdir(parents=True)
            (proc / job_id / f"{name}.onnx").write_bytes(b"m")
            if record is not None:
                journal.record(record)

        job("J1", "resume_me", JobRecord("J1", "resume_me", "compiling", attempts=1))
        job("J2", "crashy", JobRecord("J2", "crashy", "compiling", attempts=8))
        job("J3", "done", JobRecord("J3", "done", "succeeded", attempts=1))
        job("J4", "unrecorded", None)
        job("J5", "published", JobRecord("J5", "published", "compiling", attempts=1))
        job("J6", "patient", JobRecord("J6", "patient", "compiling", attempts=8, max_attempts=20))
        (proc / "J7").mkdir()
        journal.record(JobRecord("J8", "lost", "claimed"))
        journal.record(JobRecord("J9", "waiting", "detected"))
        (tmp_dir_for(outbox, "J5") / "report.json").write_text("{}")
        result = publish(outbox / ".tmp-J5", outbox, "published")
        (tmp_dir_for(outbox, "J1") / "half.onnx").write_bytes(b"partial")

        report = recover(state, outbox, max_attempts=8)
        assert [(j.job_id, j.name) for j in report.resume] == [
            ("J1", "resume_me"),
            ("J4", "unrecorded"),
            ("J6", "patient"),
        ]
        assert [j.job_id for j in report.to_fail] == ["J2"]
        assert [(j.job_id, j.result) for j in report.finish] == [("J3", None), ("J5", result)]
        assert [r.job_id for r in report.stale] == ["J8"]
        assert sorted(p.name for p in report.removed) == [".tmp-J1", "J7"]
        assert sorted(p.name for p in outbox.iterdir()) == ["published"]
        assert not (proc / "J7").exists()

    def test_empty_state_is_fine(self, tmp_path: Path) -> None:
        """A first start with no folders yet recovers nothing."""
        (tmp_path / "outbox").mkdir()
        report = recover(tmp_path / "state", tmp_path / "outbox")
        assert (report.resume, report.to_fail, report.finish, report.removed) == ((), (), (), ())
