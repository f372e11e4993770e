"""The daemon's own fuzzing, CI size (hypothesis): any inbox entry through the intake, claim, filing
and retry; and short campaigns of hostile and valid inputs through a real ``sharderd run``
(``fuzz_campaign.py``; the long campaign is ``bench/daemon_soak.py``'s ``fuzz`` phase).

Bounded like ``tests/test_fuzz.py``: ``FUZZ_EXAMPLES`` (default 200 for the intake, a tenth of it
for campaigns, at least 2) and derandomized at CI size.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unicodedata
from pathlib import Path

import pytest
from fuzz_campaign import campaign
from fuzz_inputs import KINDS
from hypothesis import given, settings
from hypothesis import strategies as st

from sharderd.daemon.intake import claim, inspect_entry
from sharderd.daemon.outbox import fail_job
from sharderd.daemon.retry import retry_failed
from sharderd.errors import BadJobError
from sharderd.filenames import MAX_NAME_BYTES

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
NAMES = st.binary(min_size=1, max_size=250).filter(
    lambda b: b"/" not in b and b"\0" not in b and not b.startswith(b".")
)
"""Names an inbox entry may have (a dot first is a writer's staging name, never a job)."""
SHAPES = ("file", "folder", "symlink", "fifo", "hard link", "folder without model")


def _entry(inbox: Path, raw: bytes, shape: str, outside: Path) -> Path:
    """An inbox entry ``raw`` (+ ``.onnx`` for a file) of ``shape``."""
    if shape in ("file", "symlink", "fifo", "hard link"):
        path = inbox / os.fsdecode(raw + b".onnx")
        if shape == "file":
            path.write_bytes(b"model bytes")
        elif shape == "symlink":
            path.symlink_to(outside)
        elif shape == "fifo":
            os.mkfifo(path)
        else:
            os.link(outside, path)
        return path
    path = inbox / os.fsdecode(raw)
    path.mkdir()
    (path / ("model.onnx" if shape == "folder" else "notes.txt")).write_bytes(b"x")
    return path


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 200, database=None)
@given(NAMES, st.sampled_from(SHAPES))
def test_any_inbox_entry_is_claimed_filed_and_retried_under_its_own_bytes(
    raw: bytes, shape: str
) -> None:
    """Whatever the name and shape: the intake judges it without raising; a job's name is
    printable UTF-8 within ``MAX_NAME_BYTES``; claimed, filed under ``failed/`` (error.json and
    error.md strict UTF-8) and retried, the entry is back in the inbox under its very bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        inbox, processing, failed = base / "inbox", base / "processing", base / "failed"
        for folder in (inbox, processing, failed):
            folder.mkdir()
        outside = base / "outside.bin"
        outside.write_bytes(b"secret")
        entry = _entry(inbox, raw, shape, outside)
        candidate = inspect_entry(inbox, entry.name)
        if shape == "folder without model":
            assert candidate is None
            return
        assert candidate is not None
        assert len(candidate.name.encode("utf-8")) <= MAX_NAME_BYTES
        assert all(unicodedata.category(c) not in ("Cc", "Cs") for c in candidate.name)
        assert (candidate.problem is None) is (shape in ("file", "folder"))
        job = claim(candidate, processing, "J1")
        assert job is not None
        dest = fail_job(job.job_dir, failed, job.name, BadJobError("x"), model=job.model)
        json.loads((dest / "error.json").read_bytes().decode("utf-8"))
        (dest / "error.md").read_bytes().decode("utf-8")
        retry_failed(failed, inbox, dest.name)
        assert os.path.lexists(entry) and not dest.exists()
        assert outside.read_bytes() == b"secret"


CI_KINDS = tuple(k for k in KINDS if k != "deep_if")
"""``deep_if`` plans for minutes until issue 40 item 3 (planning limits) lands: the bench runs it."""


@settings(max_examples=max(2, EXAMPLES // 100), deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1))
def test_a_short_campaign_through_a_real_daemon_holds(seed: int) -> None:
    """12 inputs drawn by kind, the daemon restarted in the middle (SIGTERM or kill -9): it never
    dies, nothing is stuck, every job ends exactly once, valid models are published, no bug
    (``internal_error``) but the known ones, non-jobs are left alone, nothing is left behind."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "models").mkdir()
        result = campaign(
            root,
            12,
            seed=seed,
            restart_every=6,
            outstanding=6,
            deadline_s=240,
            kinds=CI_KINDS,
            weights=tuple(1 for _ in CI_KINDS),
        )
    assert result.deaths == 0 and result.restarts == 1, result
    assert result.stuck == [] and result.problems == [], result
    assert result.internal_errors == [], result
