"""The house style is checked where CI runs: ruff's lint and its formatter over the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff")
    argv = [exe, *args] if exe else [sys.executable, "-m", "ruff", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args", [("check", "."), ("format", "--check", ".")], ids=["lint", "format"]
)
def test_ruff_is_clean(args: tuple[str, ...]) -> None:
    proc = _ruff(*args)
    assert proc.returncode == 0, (
        f"`ruff {' '.join(args)}` from the repository root:\n{proc.stdout}{proc.stderr}"
    )
