"""mypy, as configured in pyproject.toml (``[tool.mypy]``), holds on the package: a bare
``python -m mypy`` at the repository root, as a maintainer runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def mypy_errors() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert done.returncode == (1 if errors else 0), done.stdout
    return errors


def test_mypy_reports_no_error(mypy_errors: list[str]) -> None:
    """The whole package is in scope, and mypy finds nothing in it."""
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'(?m)^files = \["sharderd"\]$', text)
    assert mypy_errors == []


def test_a_callers_code_is_checked_against_the_api(tmp_path: Path) -> None:
    """The shipped types reach a caller: ``sharderd.plan`` is the function (not the subpackage of
    that name) and a wrong argument is an error."""
    (tmp_path / "caller.py").write_text(
        "import sharderd\n"
        "p = sharderd.plan('m.onnx', devices=2)\n"
        "reveal_type(p.stages[0].nodes)\n"
        "sharderd.shard('m.onnx', devices=2, out='o', backend='onnxruntme')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "caller.py"],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(REPO)},  # as if installed (the editable hook hides it)
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("caller.py:")]
    assert len(lines) == 2, done.stdout
    assert 'Revealed type is "tuple[str, ...]"' in lines[0]
    assert "caller.py:4: error:" in lines[1] and "'onnxruntme'" in lines[1]
