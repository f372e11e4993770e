"""Issue 14, "a new user's first hour": every hint sharderd prints works as written, every claim holds.

Each test runs the CLI or the daemon as a real process, on the inputs a new user meets: the broken
models of ``tests/corpus.py``, the systemd README's rename recipe, a duplicate drop, a truncated
copy, an ``ai.onnx.ml`` model, and the README's own sentences.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import chain_model, running, save_model, ts, write_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the daemon reads /proc and uses inotify")

REPO = Path(__file__).resolve().parent.parent


def sharderd(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharderd.cli", *map(str, args)], cwd=cwd, text=True,
                          capture_output=True, timeout=120, check=False)


# --- 2. the rename-in fast path -----------------------------------------------------------------


def test_twenty_renames_of_the_systemd_recipe_are_each_claimed_within_a_second(tmp_path: Path) -> None:
    """``cp model inbox/.x.onnx.part && mv inbox/.x.onnx.part inbox/x.onnx`` (the rename in the same
    clock tick as the last write, so ctime == mtime), 20 times with the default settle_seconds: each
    is detected as moved in and claimed in under a second, never after the 5 s settle window."""
    model = save_model(chain_model(7), tmp_path / "models" / "src.onnx")
    inbox = tmp_path / "inbox"
    with running(write_config(tmp_path, settle_seconds=5.0, rescan_interval=30.0)) as daemon:
        for k in range(20):
            name = f"r{k:02d}"
            part = inbox / f".{name}.onnx.part"
            subprocess.run(["cp", str(model), str(part)], check=True)
            subprocess.run(["mv", str(part), str(inbox / f"{name}.onnx")], check=True)
            moved = (inbox / f"{name}.onnx").stat().st_ctime
            claimed = daemon.wait_for("job.claimed", name=name, timeout=10)[0]
            assert ts(claimed) - moved < 1.0, (name, ts(claimed) - moved)
            daemon.wait_for("job.duplicate" if k else "job.succeeded", name=name, timeout=30)
        detected = daemon.events("job.detected")
        assert len(detected) == 20 and all(line["moved_in"] for line in detected), detected


def test_a_file_written_in_place_still_waits_for_settle_seconds(tmp_path: Path) -> None:
    """The fast path is the rename's: a model written straight into the inbox is not moved in."""
    data = save_model(chain_model(8), tmp_path / "models" / "src.onnx").read_bytes()
    with running(write_config(tmp_path, settle_seconds=1.5, rescan_interval=30.0)) as daemon:
        target = tmp_path / "inbox" / "w.onnx"
        target.write_bytes(data)
        written = target.stat().st_mtime
        claimed = daemon.wait_for("job.claimed", name="w", timeout=20)[0]
        assert ts(claimed) - written >= 1.5 - 0.05
        assert daemon.events("job.detected", name="w")[0]["moved_in"] is False

