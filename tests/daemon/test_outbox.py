"""sharderd.daemon.outbox: atomic publishing, failures, folder checks."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sharderd.config import DaemonConfig
from sharderd.daemon import outbox as outbox_module
from sharderd.daemon.dirs import check_same_filesystem, prepare_dirs
from sharderd.daemon.outbox import (
    JOB_MARKER,
    fail_job,
    find_published,
    publish,
    rename_unique,
    tmp_dir_for,
)
from sharderd.errors import ConfigError, ModelInvalidError, NotProvenError, PlanInfeasibleError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outbox(tmp_path: Path) -> Path:
    path = tmp_path / "outbox"
    path.mkdir()
    return path


def make_result(outbox: Path, job_id: str) -> Path:
    tmp = tmp_dir_for(outbox, job_id)
    (tmp / "model.onnx").write_bytes(b"sharded")
    (tmp / "stages").mkdir()
    (tmp / "stages" / "stage0.onnx").write_bytes(b"s0")
    return tmp


class TestPublish:
    def test_publish_renames_with_modes_and_marker(self, outbox: Path) -> None:
        """The result appears whole under its name, with the configured modes and the job marker."""
        make_result(outbox, "J1")
        dest = publish(outbox / ".tmp-J1", outbox, "bert", file_mode=0o600, dir_mode=0o700)
        assert dest == outbox / "bert"
        assert sorted(p.name for p in outbox.iterdir()) == ["bert"]
        assert (dest / "stages" / "stage0.onnx").read_bytes() == b"s0"
        assert (dest / JOB_MARKER).read_text() == "J1\n"
        assert stat.S_IMODE((dest / "model.onnx").stat().st_mode) == 0o600
        assert stat.S_IMODE((dest / "stages").stat().st_mode) == 0o700
        assert stat.S_IMODE(dest.stat().st_mode) == 0o700

    @pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "fallback"])
    def test_collisions_get_suffixes_and_nothing_is_replaced(
        self, outbox: Path, renameat2: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Taken names (a result, an empty folder, a file) are skipped: name, name-1, name-2..."""
        if not renameat2:
            monkeypatch.setattr(outbox_module, "_renameat2", None)
        (outbox / "m-1").mkdir()
        (outbox / "m-2").write_text("a user's file")
        dests = []
        for job_id in ("J1", "J2", "J3"):
            make_result(outbox, job_id)
            dests.append(publish(outbox / f".tmp-{job_id}", outbox, "m").name)
        assert dests == ["m", "m-3", "m-4"]
        assert list((outbox / "m-1").iterdir()) == []
        assert (outbox / "m-2").read_text() == "a user's file"

    def test_concurrent_publishers_never_clobber(self, outbox: Path) -> None:
        """Two processes publishing 20 results each under one name keep all 40, each once."""
        script = (
            "import sys; from pathlib import Path\n"
            "from sharderd.daemon.outbox import publish, tmp_dir_for\n"
            "out, tag = Path(sys.argv[1]), sys.argv[2]\n"
            "tmps = [tmp_dir_for(out, f'{tag}{i}') for i in range(20)]\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "for t in tmps: publish(t, out, 'same')\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(outbox), tag],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for tag in ("A", "B")
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            p.communicate(timeout=60)
            assert p.returncode == 0
        markers = sorted((d / JOB_MARKER).read_text().strip() for d in outbox.iterdir())
        assert markers == sorted(f"{tag}{i}" for tag in "AB" for i in range(20))

    def test_find_published_matches_the_marker(self, outbox: Path) -> None:
        """Recovery finds a job's result among suffixed names by its marker, not by name alone."""
        for job_id in ("J1", "J2"):
            make_result(outbox, job_id)
            publish(outbox / f".tmp-{job_id}", outbox, "m")
        make_result(outbox, "J3")
        publish(outbox / ".tmp-J3", outbox, "m-extra")
        assert find_published(outbox, "m", "J2") == outbox / "m-1"
        assert find_published(outbox, "m", "J3") is None
        assert find_published(outbox, "m", "J9") is None

    def test_refuses_foreign_tmp_and_bad_names(self, outbox: Path, tmp_path: Path) -> None:
        """Only ``outbox/.tmp-*`` can be published, and only under a plain file name."""
        with pytest.raises(ValueError, match="not an"):
            publish(tmp_path, outbox, "x")
        with pytest.raises(ValueError, match="usable file name"):
            rename_unique(make_result(outbox, "J1"), outbox, "../escape")


class TestFailJob:
    def test_writes_error_json_and_md(self, tmp_path: Path) -> None:
        """The input moves to failed/<name>/ beside error.json (fields) and error.md (readable)."""
        job_dir = tmp_path / "processing" / "J1"
        job_dir.mkdir(parents=True)
        (job_dir / "bert.onnx").write_bytes(b"broken")
        err = ModelInvalidError("node 3 has no name", hint="Pass --name-nodes or name the nodes.")
        dest = fail_job(job_dir, tmp_path / "failed", "bert", err, now=1_700_000_000.0)
        assert dest == tmp_path / "failed" / "bert"
        assert not job_dir.exists()
        assert (dest / "bert.onnx").read_bytes() == b"broken"
        info = json.loads((dest / "error.json").read_text())
        assert info == {
            "reason": "bad_model",
            "message": "node 3 has no name",
            "hint": "Pass --name-nodes or name the nodes.",
            "exit_code": 2,
            "job_id": "J1",
            "name": "bert",
            "time": "2023-11-14T22:13:20.000Z",
        }
        md = (dest / "error.md").read_text()
        assert "**What went wrong.** node 3 has no name" in md
        assert "**What to do.** Pass --name-nodes or name the nodes." in md

    def test_the_plan_command_runs_as_printed_for_a_name_that_is_not_utf8(
        self, tmp_path: Path
    ) -> None:
        """The input is ``-\\xe9.onnx`` (latin-1, a leading dash): error.md and error.json are UTF-8
        (``%E9`` for the byte), and its ``sharderd plan`` command, run by bash as printed, reads the
        very file (exit 2 with its own verdict, not "no such file")."""
        job_dir = tmp_path / "processing" / "J9"
        job_dir.mkdir(parents=True)
        model = Path(os.fsdecode(os.fsencode(job_dir) + b"/-\xe9.onnx"))
        model.write_bytes(b"broken")
        err = ModelInvalidError(f"{model} is not an ONNX model")
        dest = fail_job(job_dir, tmp_path / "failed", "-%E9", err, model=model)
        info = json.loads((dest / "error.json").read_bytes().decode("utf-8"))
        assert info["message"].endswith("/-%E9.onnx is not an ONNX model")
        md = (dest / "error.md").read_bytes().decode("utf-8")
        [plan] = re.findall(r"`(sharderd plan [^`]+)`", md)
        assert "retry -- -%E9`" in md
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        ran = subprocess.run(["bash", "-c", plan], capture_output=True, env=env, timeout=120)
        assert ran.returncode == 2 and b"not an ONNX model" in ran.stderr, ran.stderr

    def test_dict_error_with_details_and_collision(self, tmp_path: Path) -> None:
        """A crash report dict keeps its extra fields; a second failure of one name gets a suffix."""
        failed = tmp_path / "failed"
        (failed / "m").mkdir(parents=True)
        job_dir = tmp_path / "processing" / "J2"
        job_dir.mkdir(parents=True)
        error = {
            "reason": "worker_crashed",
            "message": "the worker died",
            "signal": "SIGKILL",
            "stderr_tail": "line\n" * 2000,
        }
        dest = fail_job(job_dir, failed, "m", error)
        assert dest == failed / "m-1"
        info = json.loads((dest / "error.json").read_text())
        assert (info["signal"], info["exit_code"], info["hint"]) == ("SIGKILL", 1, None)
        md = (dest / "error.md").read_text()
        assert "- signal: SIGKILL" in md
        assert "crashed repeatedly" in md  # the advice for the reason when there is no hint
        assert "stderr_tail (last 4000 characters)" in md and len(md) < 6000

    def test_no_split_says_the_sidecar_line(self, tmp_path: Path) -> None:
        """A job ended without a split (proven or not) is filed under its own reason, with
        ``proven``/``grounds``, and error.md gives the sidecar line for the suggested device
        count instead of the CLI's ``--devices``."""
        for n, error, reason in (
            (
                1,
                NotProvenError(
                    "no fitting split found", hint="rerun with --devices 6", min_devices=6
                ),
                "not_proven",
            ),
            (
                2,
                PlanInfeasibleError("weights", grounds="weights_total", min_devices=6),
                "does_not_fit",
            ),
        ):
            job_dir = tmp_path / "processing" / f"J{n}"
            job_dir.mkdir(parents=True)
            dest = fail_job(job_dir, tmp_path / "failed", f"m{n}", error)
            info = json.loads((dest / "error.json").read_text())
            assert info["reason"] == reason and info["exit_code"] == error.exit_code
            assert info["proven"] is (reason == "does_not_fit") and info["min_devices"] == 6
            md = (dest / "error.md").read_text()
            assert f"Set `devices = 6` in the job's sidecar (`m{n}.toml`" in md
            assert "--devices" not in md.split("**What to do.**")[1].splitlines()[0]


class TestFolders:
    def test_same_filesystem_passes(self, tmp_path: Path) -> None:
        """Folders on one filesystem are accepted."""
        check_same_filesystem(tmp_path, tmp_path, tmp_path)

    def test_different_filesystems_named(self, tmp_path: Path) -> None:
        """Folders on different filesystems are refused with every path named."""
        other = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/proc")
        if other.stat().st_dev == tmp_path.stat().st_dev:
            pytest.skip("no second filesystem to compare against")
        with pytest.raises(ConfigError) as info:
            check_same_filesystem(tmp_path, tmp_path, other)
        assert f"outbox {other}" in str(info.value) and f"inbox {tmp_path}" in str(info.value)
        assert "one filesystem" in str(info.value)

    def test_prepare_creates_every_folder(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """All folders are created with dir_mode; the runtime folder follows RUNTIME_DIRECTORY."""
        monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
        config = DaemonConfig(
            inbox=tmp_path / "in",
            outbox=tmp_path / "out",
            state_dir=tmp_path / "st",
            dir_mode=0o700,
        )
        dirs = prepare_dirs(config)
        assert (
            dirs.processing == tmp_path / "st" / "processing" and dirs.runtime == tmp_path / "run"
        )
        for path in (
            dirs.inbox,
            dirs.outbox,
            dirs.processing,
            dirs.failed,
            dirs.done,
            dirs.journal,
            dirs.index,
            dirs.runtime,
        ):
            assert path.is_dir() and stat.S_IMODE(path.stat().st_mode) == 0o700

    def test_prepare_names_the_bad_path(self, tmp_path: Path) -> None:
        """A file where a folder should be, or a folder that cannot be created, is named."""
        (tmp_path / "in").write_text("not a folder")
        config = DaemonConfig(
            inbox=tmp_path / "in", outbox=tmp_path / "out", state_dir=tmp_path / "st"
        )
        with pytest.raises(
            ConfigError, match=f"inbox {tmp_path / 'in'} exists and is not a directory"
        ):
            prepare_dirs(config)
        config = DaemonConfig(
            inbox=tmp_path / "in" / "sub", outbox=tmp_path / "out", state_dir=tmp_path / "st"
        )
        with pytest.raises(ConfigError, match=f"cannot create inbox {tmp_path / 'in' / 'sub'}"):
            prepare_dirs(config)

    def test_prepare_refuses_missing_inbox_when_asked(self, tmp_path: Path) -> None:
        """With ``create_inbox=False`` a missing inbox is an error naming it."""
        config = DaemonConfig(
            inbox=tmp_path / "in", outbox=tmp_path / "out", state_dir=tmp_path / "st"
        )
        with pytest.raises(ConfigError, match="does not exist"):
            prepare_dirs(config, create_inbox=False)

    def test_prepare_refuses_nested_layout(self, tmp_path: Path) -> None:
        """An outbox inside the inbox (results re-ingested as jobs) is refused."""
        config = DaemonConfig(
            inbox=tmp_path / "in", outbox=tmp_path / "in" / "out", state_dir=tmp_path / "st"
        )
        with pytest.raises(ConfigError, match="neither inside the other"):
            prepare_dirs(config)
