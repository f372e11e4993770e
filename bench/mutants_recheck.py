"""Re-check named mutmut mutants against chosen tests, without mutmut's test selection.

``mutmut run`` judges each mutant by the tests of ``[tool.mutmut]``'s selection that ran the
mutated function; a test added outside that selection (a new test file) would reset every cached
result if the selection changed. This applies each mutant's diff (as ``mutmut show`` prints it,
from ``mutants/``) to a scratch copy of ``sharderd/`` and ``tests/`` and runs the given tests
there: ``killed`` when they fail, ``SURVIVED`` when they pass. Run from the repository root after
a ``mutmut run``:

    python bench/mutants_recheck.py tests/plan/test_search.py -- NAME [NAME ...]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    cut = argv.index("--")
    tests, names = argv[:cut], argv[cut + 1 :]
    os.chdir(REPO)
    scratch = Path(tempfile.mkdtemp(prefix="mutants-recheck-"))
    try:
        for part in ("sharderd", "tests"):
            shutil.copytree(REPO / part, scratch / part)
        shutil.copy(REPO / "pyproject.toml", scratch / "pyproject.toml")
        for name in names:
            print(name, _verdict(name, tests, scratch), flush=True)
    finally:
        shutil.rmtree(scratch)
    return 0


def _verdict(name: str, tests: list[str], scratch: Path) -> str:
    module = name.split(".x")[0]  # sharderd.plan.search.x_learn__mutmut_1 -> sharderd.plan.search
    diff = get_diff_for_mutant(name, path=module.replace(".", "/") + ".py")
    header = re.search(r"^--- (\S+)", diff, re.M)
    if header is None:
        return "NO DIFF"
    target = scratch / header.group(1)
    original = target.read_text()
    try:
        patched = subprocess.run(
            ["patch", "-p0", "--no-backup-if-mismatch", str(target)],
            input=diff[header.start() :],
            capture_output=True,
            text=True,
            check=False,
        )
        if patched.returncode:
            return "PATCH FAILED"
        env = dict(os.environ, PYTHONPATH=str(scratch))
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-p", "no:cacheprovider", *tests],
            cwd=scratch,
            env=env,
            capture_output=True,
            check=False,
        )
        return "killed" if run.returncode else "SURVIVED"
    finally:
        target.write_text(original)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
