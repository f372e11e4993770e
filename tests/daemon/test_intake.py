"""sharderd.daemon.intake: the inbox protocol on real files."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from sharderd.daemon.inotify import InboxInotify, InotifyBatch, parse_events
from sharderd.daemon.intake import (
    Candidate,
    FileStat,
    Settler,
    claim,
    inspect_entry,
    is_staging_name,
    new_job_id,
    scan_inbox,
)

ROOT = Path(__file__).resolve().parents[2]
PAST_NS = 1_600_000_000 * 10**9


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    path = tmp_path / "inbox"
    path.mkdir()
    return path


@pytest.fixture
def processing(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "processing"
    path.mkdir(parents=True)
    return path


def write(path: Path, data: bytes = b"onnx") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def rename_in(inbox: Path, name: str, data: bytes = b"model bytes") -> Path:
    """Write ``.name.part`` with an old mtime, then rename it to ``name``, as a careful uploader does."""
    part = write(inbox / f".{name}.part", data)
    os.utime(part, ns=(PAST_NS, PAST_NS))
    final = inbox / name
    part.rename(final)
    return final


class TestStagingNames:
    @pytest.mark.parametrize(
        ("name", "staging"),
        [
            ("a.onnx", False),
            ("job", False),
            ("-a.onnx", False),
            (".a.onnx.part", True),
            ("a.onnx.part", True),
            ("a.onnx.tmp", True),
            ("a.onnx~", True),
            (".staging", True),
        ],
    )
    def test_staging_names(self, name: str, staging: bool) -> None:
        """Dotfiles, ``*.part``, ``*.tmp`` and ``*~`` are a writer's names, never jobs (the watch
        is on the inbox alone: what is inside a folder job is looked at by its settle looks)."""
        assert is_staging_name(name) is staging


class TestScan:
    def test_recognises_jobs_and_ignores_the_rest(self, inbox: Path) -> None:
        """File and folder jobs are found with their sidecars; staging and stray names are not jobs."""
        write(inbox / "a.onnx")
        write(inbox / "a.toml", b"devices = 4\n")
        write(inbox / "b" / "model.onnx")
        write(inbox / "b" / "weights.bin", b"w" * 100)
        write(inbox / "b" / "sharderd.toml", b"")
        write(inbox / "C.ONNX")
        for stray in (
            ".hidden.onnx",
            "x.onnx.part",
            "y.onnx.tmp",
            "z.onnx~",
            "notes.txt",
            "lonely.toml",
        ):
            write(inbox / stray)
        (inbox / "empty").mkdir()
        write(inbox / "nomodel" / "weights.bin")
        found = {c.name: c for c in scan_inbox(inbox)}
        assert sorted(found) == ["C", "a", "b"]
        a, b = found["a"], found["b"]
        assert (a.kind, a.path, a.model, a.sidecar, a.problem) == (
            "file",
            inbox / "a.onnx",
            inbox / "a.onnx",
            inbox / "a.toml",
            None,
        )
        assert (b.kind, b.model, b.sidecar, b.problem) == (
            "dir",
            inbox / "b" / "model.onnx",
            inbox / "b" / "sharderd.toml",
            None,
        )
        assert [s.rel for s in b.signature] == [
            "b",
            "b/model.onnx",
            "b/sharderd.toml",
            "b/weights.bin",
        ]
        assert [s.rel for s in a.signature] == ["a.onnx", "a.toml"]

    def test_folder_signature_sees_inner_growth(self, inbox: Path) -> None:
        """Appending to external data inside a folder job changes the folder's signature."""
        write(inbox / "b" / "model.onnx")
        data = write(inbox / "b" / "weights.bin", b"1")
        before = inspect_entry(inbox, "b")
        with open(data, "ab") as f:
            f.write(b"2")
        after = inspect_entry(inbox, "b")
        assert before is not None and after is not None
        assert before.signature != after.signature

    def test_two_models_in_a_folder_is_a_bad_job(self, inbox: Path) -> None:
        """A folder with two .onnx is a candidate with a problem naming both (claimed and failed)."""
        write(inbox / "b" / "one.onnx")
        write(inbox / "b" / "two.onnx")
        [c] = scan_inbox(inbox)
        assert c.model is None
        assert c.problem is not None and "one.onnx, two.onnx" in c.problem

    def test_symlinked_model_is_not_followed(self, inbox: Path, tmp_path: Path) -> None:
        """``x.onnx`` as a link is a bad job whose signature is the link's own inode."""
        target = write(tmp_path / "outside.onnx", b"secret" * 100)
        (inbox / "x.onnx").symlink_to(target)
        [c] = scan_inbox(inbox)
        assert c.problem is not None and "symbolic link" in c.problem
        assert c.signature[0].inode == os.lstat(inbox / "x.onnx").st_ino != target.stat().st_ino

    def test_symlinked_folder_is_a_bad_job_other_links_ignored(
        self, inbox: Path, tmp_path: Path
    ) -> None:
        """A suffix-less link (folder form) is a bad job; a link named like a non-job is ignored."""
        (tmp_path / "real").mkdir()
        write(tmp_path / "real" / "m.onnx")
        (inbox / "job").symlink_to(tmp_path / "real")
        (inbox / "notes.txt").symlink_to(tmp_path / "real")
        [c] = scan_inbox(inbox)
        assert (c.name, c.kind, c.model) == ("job", "dir", None)
        assert c.problem is not None and "symbolic link" in c.problem

    def test_symlinked_sidecar_is_a_bad_job(self, inbox: Path, tmp_path: Path) -> None:
        """A model whose sidecar is a link is failed rather than run with a file from elsewhere."""
        write(inbox / "a.onnx")
        (inbox / "a.toml").symlink_to(write(tmp_path / "elsewhere.toml", b"devices = 2\n"))
        [c] = scan_inbox(inbox)
        assert c.problem is not None and "sidecar a.toml is a symbolic link" in c.problem

    def test_fifo_model_is_not_a_regular_file(self, inbox: Path) -> None:
        """A FIFO named like a model is a bad job (reading it would block)."""
        os.mkfifo(inbox / "p.onnx")
        [c] = scan_inbox(inbox)
        assert c.problem == "the model p.onnx is not a regular file"


def cand(
    size: int = 1, *, ctime: int = 10, mtime: int = 10, path: str = "/inbox/a.onnx"
) -> Candidate:
    p = Path(path)
    return Candidate(p.stem, p, "file", p, None, (FileStat(p.name, size, mtime, ctime, 7),))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TestSettler:
    def test_in_place_write_settles_after_quiet_window(self) -> None:
        """Complete only once the signature has been unchanged for settle_seconds since its last change."""
        clock = Clock()
        settler = Settler(5.0, now=clock)
        assert not settler.observe(cand(1))
        clock.t += 3
        assert not settler.observe(cand(2))
        clock.t += 4.9
        assert not settler.observe(cand(2))
        assert settler.next_due() == pytest.approx(108.0)
        clock.t += 0.1
        assert settler.observe(cand(2))

    def test_renamed_completes_after_confirm(self) -> None:
        """An entry an ``IN_MOVED_TO`` named completes on a second identical look confirm_seconds later,
        whatever its timestamps say (a rename in the same tick as the last write has ctime == mtime)."""
        clock = Clock()
        settler = Settler(5.0, confirm_seconds=0.5, now=clock)
        moved = cand(ctime=10, mtime=10)
        assert not settler.observe(moved, renamed=True)
        assert settler.next_due() == 100.5
        clock.t += 0.25
        assert not settler.observe(moved)
        clock.t += 0.25
        assert settler.observe(moved)

    def test_timestamps_alone_never_take_the_fast_path(self) -> None:
        """ctime > mtime without a rename event (a chmod after writing, a rescan) settles fully."""
        clock = Clock()
        settler = Settler(5.0, now=clock)
        moved = cand(ctime=20, mtime=10)
        settler.observe(moved)
        clock.t += 1
        assert not settler.observe(moved)
        clock.t += 4
        assert settler.observe(moved)

    def test_change_after_rename_drops_fast_path(self) -> None:
        """If the signature changes after the rename, the quiet window starts over."""
        clock = Clock()
        settler = Settler(5.0, now=clock)
        settler.observe(cand(1), renamed=True)
        clock.t += 0.2
        assert not settler.observe(cand(2))
        clock.t += 0.2
        assert not settler.observe(cand(2))

    def test_zero_settle_is_immediate_and_tracks_are_dropped(self) -> None:
        """settle_seconds=0 completes on the first look; retain and forget drop tracks."""
        settler = Settler(0.0, now=Clock())
        assert settler.observe(cand(path="/inbox/a.onnx"))
        settler.observe(cand(path="/inbox/b.onnx"))
        settler.retain([Path("/inbox/b.onnx")])
        assert len(settler) == 1
        settler.forget(Path("/inbox/b.onnx"))
        assert len(settler) == 0 and settler.next_due() is None

    def test_real_rename_is_fast_real_append_is_not(self, inbox: Path) -> None:
        """On real files: the renamed one is complete after the confirm look, the appended one is not."""
        clock = Clock()
        settler = Settler(5.0, confirm_seconds=0.125, now=clock)
        with _watch(inbox) as watch:
            rename_in(inbox, "r.onnx")
            growing = write(inbox / "g.onnx", b"1")
            renamed = {inbox / n for n in _batch(watch).moved_in}
        assert renamed == {inbox / "r.onnx"}
        for c in scan_inbox(inbox):
            assert not settler.observe(c, renamed=c.path in renamed)
        with open(growing, "ab") as f:
            f.write(b"2")
        clock.t += 0.25
        done = {c.name for c in scan_inbox(inbox) if settler.observe(c)}
        assert done == {"r"}


def _watch(inbox: Path) -> InboxInotify:
    watch = InboxInotify.open(inbox)
    assert watch is not None, "inotify is available on Linux"
    return watch


def _batch(watch: InboxInotify) -> InotifyBatch:
    return anyio.run(watch.next_batch)


class TestInboxInotify:
    """Every change of an inbox entry, any name; ``IN_MOVED_TO`` tells exactly the ones renamed in."""

    def test_part_pair_and_outside_rename_and_folder_are_renames(
        self, inbox: Path, tmp_path: Path
    ) -> None:
        """The systemd README's recipe (``.x.onnx.part`` then ``mv``), a ``mv`` from another folder
        and a folder renamed in are all reported, each in the same clock tick as its last write."""
        outside = tmp_path / "staging"
        outside.mkdir()
        with _watch(inbox) as watch:
            write(inbox / ".a.onnx.part", b"a").rename(inbox / "a.onnx")
            write(outside / "b.onnx", b"b").rename(inbox / "b.onnx")
            write(outside / "c" / "c.onnx", b"c")
            (outside / "c").rename(inbox / "c")
            seen: set[str] = set()
            while len(seen) < 3:
                seen |= _batch(watch).moved_in
        assert seen == {"a.onnx", "b.onnx", "c"}

    def test_file_written_in_place_is_a_change_not_a_rename(self, inbox: Path) -> None:
        """A file created and written in the inbox is a change without ``IN_MOVED_TO``; a later
        rename is both."""
        with _watch(inbox) as watch:
            write(inbox / "in-place.onnx", b"x")
            (inbox / "sub").mkdir()
            write(inbox / "later.onnx.part", b"y").rename(inbox / "later.onnx")
            batch = _batch(watch)
        assert batch.moved_in == {"later.onnx"}
        assert {"in-place.onnx", "sub", "later.onnx.part", "later.onnx"} <= batch.changed

    def test_a_name_that_is_not_utf8_is_reported(self, inbox: Path) -> None:
        """A latin-1 ``été.onnx`` written in place and one renamed in are reported by their bytes
        (watchfiles fails its whole batch on such a name: "Unable to decode path")."""
        raw = os.fsencode(inbox) + b"/\xe9t\xe9"
        with _watch(inbox) as watch:
            written = Path(os.fsdecode(raw + b".onnx"))
            written.write_bytes(b"x")
            written.rename(os.fsdecode(raw + b"2.onnx"))
            batch = _batch(watch)
        assert os.fsencode(inbox / next(iter(batch.moved_in))) == raw + b"2.onnx"
        assert {os.fsencode(n) for n in batch.changed} >= {b"\xe9t\xe9.onnx", b"\xe9t\xe92.onnx"}

    def test_a_deleted_inbox_ends_the_watch(self, inbox: Path) -> None:
        with _watch(inbox) as watch:
            inbox.rmdir()
            assert _batch(watch).gone

    def test_parse_events_reads_names_overflow_and_ignored(self) -> None:
        """The raw ``struct inotify_event`` stream: padded names, overflow and a removed watch."""

        def event(mask: int, name: bytes = b"") -> bytes:
            padded = name + b"\0" * (-len(name) % 16 or (16 if name else 0))
            return struct.pack("iIII", 1, mask, 0, len(padded)) + padded

        data = (
            event(0x80, b"x.onnx") + event(0x100, b"created.onnx") + event(0x4000) + event(0x8000)
        )
        assert parse_events(data) == InotifyBatch(
            frozenset({"x.onnx", "created.onnx"}), frozenset({"x.onnx"}), True, True
        )


class TestClaim:
    def test_claim_file_with_sidecar(self, inbox: Path, processing: Path) -> None:
        """Model and sidecar move into processing/<job_id>/ with their bytes intact."""
        write(inbox / "a.onnx", b"model-bytes")
        write(inbox / "a.toml", b"devices = 4\n")
        [c] = scan_inbox(inbox)
        job = claim(c, processing, "J1")
        assert job is not None
        assert (job.job_dir, job.model, job.sidecar) == (
            processing / "J1",
            processing / "J1" / "a.onnx",
            processing / "J1" / "a.toml",
        )
        assert job.model.read_bytes() == b"model-bytes"
        assert job.sidecar.read_text() == "devices = 4\n"
        assert list(inbox.iterdir()) == []

    def test_claim_folder(self, inbox: Path, processing: Path) -> None:
        """A folder job moves whole; model and inner sidecar paths point inside it."""
        write(inbox / "b" / "m.onnx")
        write(inbox / "b" / "w.bin", b"w")
        write(inbox / "b" / "sharderd.toml", b"")
        [c] = scan_inbox(inbox)
        job = claim(c, processing, "J2")
        assert job is not None
        assert job.entry == processing / "J2" / "b"
        assert (job.model, job.sidecar) == (job.entry / "m.onnx", job.entry / "sharderd.toml")
        assert (job.entry / "w.bin").read_bytes() == b"w"

    def test_vanished_path_returns_none(self, inbox: Path, processing: Path) -> None:
        """A second claim of the same candidate gets None and leaves no empty job folder."""
        write(inbox / "a.onnx")
        [c] = scan_inbox(inbox)
        assert claim(c, processing, "J1") is not None
        assert claim(c, processing, "J2") is None
        assert sorted(p.name for p in processing.iterdir()) == ["J1"]

    def test_two_daemons_race_each_job_claimed_once(self, inbox: Path, tmp_path: Path) -> None:
        """Two processes claiming the same 40 candidates at once: every job is taken exactly once."""
        names = [f"m{i:02d}" for i in range(40)]
        for name in names:
            write(inbox / f"{name}.onnx", name.encode())
        script = (
            "import json, sys; from pathlib import Path\n"
            "from sharderd.daemon.intake import scan_inbox, claim, new_job_id\n"
            "inbox, proc = Path(sys.argv[1]), Path(sys.argv[2]); proc.mkdir(parents=True)\n"
            "cands = scan_inbox(inbox); print('ready', flush=True); sys.stdin.readline()\n"
            "won = [c.name for c in cands if claim(c, proc, new_job_id())]\n"
            "print(json.dumps(won), flush=True)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(inbox), str(tmp_path / f"proc{k}")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for k in range(2)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        won = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        assert sorted(won[0] + won[1]) == names
        assert not set(won[0]) & set(won[1])
        on_disk = sorted(f.name for k in range(2) for f in (tmp_path / f"proc{k}").glob("*/*.onnx"))
        assert on_disk == [f"{n}.onnx" for n in names]


def test_job_ids_sort_by_time_and_are_unique() -> None:
    """Ids from later times sort later; ids from the same instant differ."""
    early, late = new_job_id(1_700_000_000.001), new_job_id(1_700_000_000.002)
    assert early < late
    assert re.fullmatch(r"20231114T221320001Z-[0-9a-f]{8}", early)
    assert len({new_job_id(1_700_000_000.0) for _ in range(1000)}) == 1000
