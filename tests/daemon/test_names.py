"""Any name the filesystem allows, through a real ``sharderd run``: claimed, logged as valid UTF-8
JSON, published under a safe bounded name with the original bytes in report.json, failed into
``failed/`` with an error.md whose printed commands run as written.

Four names each, valid and broken: latin-1 ``été`` (not UTF-8), 255 bytes (the filesystem's limit),
a newline, a leading dash.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import DaemonProcess, chain_model, running, save_model, write_config

from sharderd.filenames import MAX_NAME_BYTES, safe_name

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

LONG = b"n" * (255 - len(b".onnx"))
"""A stem whose ``.onnx`` file name is 255 bytes, the most Linux allows."""
NAMES = {"latin-1": b"\xe9t\xe9", "255 bytes": LONG, "newline": b"two\nlines", "dash": b"-v2"}
BIN = Path(sys.executable).parent


def _entry(folder: Path, stem: bytes) -> Path:
    """``folder/<stem>.onnx``, the name given as bytes (``os.fsdecode``: any bytes)."""
    return folder / os.fsdecode(stem + b".onnx")


def _drop(root: Path, stem: bytes, data: bytes) -> Path:
    """Write the model beside the inbox, then rename it in under ``stem + .onnx`` (raw bytes)."""
    staging = _entry(root / "models", stem)
    staging.write_bytes(data)
    return staging.rename(_entry(root / "inbox", stem))


def _model_bytes(seed: int) -> bytes:
    path = save_model(chain_model(seed), Path(f"/tmp/sharderd-names-{os.getpid()}-{seed}.onnx"))
    try:
        return path.read_bytes()
    finally:
        path.unlink()


def _check_log_is_utf8_json(daemon: DaemonProcess) -> None:
    """Every stdout line parsed as JSON (a line with invalid UTF-8 would not) and holds no lone
    surrogate (a backslash-udcXX escape, which strict JSON readers refuse); no watch failure."""
    assert not daemon.events("<not json>"), daemon.events("<not json>")
    for line in daemon.lines:
        json.dumps(line, ensure_ascii=False).encode("utf-8")  # strict: raises on a surrogate
    assert not daemon.events("watch.failed")
    assert not daemon.events("daemon.error")


def test_any_valid_name_is_published_once_under_a_safe_name(root: Path) -> None:
    """Each name's model is published in ``outbox/<safe_name>/``; its report.json has the entry's
    exact bytes; its files fit the filesystem's 255 bytes; the log names it in valid UTF-8."""
    config = write_config(root)
    with running(config) as daemon:
        for seed, stem in enumerate(NAMES.values()):
            _drop(root, stem, _model_bytes(seed))
        daemon.wait_for("job.succeeded", count=len(NAMES), timeout=120)
        _check_log_is_utf8_json(daemon)
    outbox = root / "outbox"
    for stem in NAMES.values():
        safe = safe_name(os.fsdecode(stem))
        folder = outbox / safe
        report = json.loads((folder / "report.json").read_bytes().decode("utf-8"))
        assert bytes.fromhex(report["job"]["entry_hex"]) == stem + b".onnx"
        assert report["job"]["name"] == safe and report["status"] == "not_compiled"
        assert (folder / f"{safe}.sharded.onnx").is_file()
        assert max(len(os.fsencode(p.name)) for p in folder.iterdir()) <= 255
    assert len(os.fsencode(safe_name(os.fsdecode(LONG)))) == MAX_NAME_BYTES
    assert list((root / "inbox").iterdir()) == []


def test_any_broken_name_is_failed_and_its_printed_commands_run(root: Path) -> None:
    """A broken model under each name lands in ``failed/<safe_name>/`` with the input under its own
    bytes; the ``sharderd retry`` command error.md prints, run by bash as printed (``--`` before a
    name with a leading dash), puts the input back into the inbox under its own bytes."""
    config = write_config(root)
    with running(config) as daemon:
        for stem in NAMES.values():
            _drop(root, stem, b"not a model")
        daemon.wait_for("job.failed", count=len(NAMES), timeout=120)
        _check_log_is_utf8_json(daemon)
        for line in daemon.events("job.failed"):
            assert "/processing/" not in line["message"], line  # names where the user finds it
    failed = root / "state" / "failed"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for stem in NAMES.values():
        folder = failed / safe_name(os.fsdecode(stem))
        assert _entry(folder, stem).read_bytes() == b"not a model"
        error = json.loads((folder / "error.json").read_bytes().decode("utf-8"))
        assert bytes.fromhex(error["entry_hex"]) == stem + b".onnx"
        error_md = (folder / "error.md").read_text(encoding="utf-8")
        [retry] = re.findall(r"`(sharderd retry [^`]+)`", error_md)
        ran = subprocess.run(["bash", "-c", retry], capture_output=True, env=env, timeout=60)
        assert ran.returncode == 0, (retry, ran.stderr)
        assert _entry(root / "inbox", stem).is_file()
        assert not folder.exists()
