"""``sharderd shard`` with a model named at the filesystem's limit: the output names fit, or the
failure says why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sharderd import examples
from sharderd.filenames import MAX_NAME_BYTES, safe_name

Run = Callable[..., subprocess.CompletedProcess[str]]


def _model(folder: Path, stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return examples.save(examples.chain(nodes=6, hidden=4), folder / f"{stem}.onnx")


@pytest.mark.parametrize(
    "length", [MAX_NAME_BYTES, MAX_NAME_BYTES + 1, 255 - len(".onnx")], ids=["at", "over", "255"]
)
def test_a_name_up_to_255_bytes_shards(tmp_path: Path, run_cli: Run, length: int) -> None:
    """At ``MAX_NAME_BYTES`` the files keep the model's name; past it (up to a 255-byte file name,
    whose ``<stem>.sharded.onnx`` no filesystem takes) they get ``safe_name``'s, and stderr says so."""
    stem = "m" * length
    path = _model(tmp_path / "models", stem)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("shard", path, "--devices", "2", "--backend", "none", "-q", cwd=work)
    assert proc.returncode == 0, proc.stderr
    named = safe_name(stem)
    assert (named == stem) is (length <= MAX_NAME_BYTES)
    assert (work / f"{named}.sharded" / f"{named}.sharded.onnx").is_file()
    assert ("the output files are named" in proc.stderr) is (named != stem)


def test_a_name_too_long_for_the_filesystem_says_so(tmp_path: Path, run_cli: Run) -> None:
    """An output folder whose name passes 255 bytes fails with the cause, not "free space"."""
    path = _model(tmp_path / "models", "m")
    out = tmp_path / ("o" * 256)
    proc = run_cli("shard", path, "--devices", "2", "--backend", "none", "-q", "--out", out)
    assert proc.returncode == 1
    assert "longer than the filesystem allows" in proc.stderr
    assert "free space" not in proc.stderr and "permissions" not in proc.stderr
    assert not os.path.lexists(out)
