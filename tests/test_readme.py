"""README.md is the front door: short, every link resolves, every example runs as written."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCUMENTS = [
    REPO / "README.md",
    REPO / "BENCHMARKS.md",
    REPO / "systemd" / "README.md",
    REPO / "bench" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to dashes."""
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        slugs.add(text.replace(" ", "-"))
    return slugs


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)\n```", README, re.S)


def test_readme_is_one_screen_per_question() -> None:
    assert len(README.splitlines()) <= 150


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    """A link to a file names one that exists; a link to a heading names one that exists there."""
    broken = []
    for target in LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists() or (
            anchor
            and resolved.suffix == ".md"
            and anchor not in _anchors(resolved.read_text(encoding="utf-8"))
        ):
            broken.append(target)
    assert broken == [], f"{document.name}: {broken}"


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A README line as a shell runs it, with this interpreter's sharderd."""
    line = command.split("#", 1)[0].strip()
    line = line.replace("sharderd ", f"{sys.executable} -m sharderd.cli ")
    return subprocess.run(
        line, shell=True, cwd=cwd, text=True, capture_output=True, timeout=300, check=False
    )


def test_readme_engine_examples_run_as_written(tmp_path: Path) -> None:
    """The example-model / plan / shard block, the real-export `plan` line (on a tiny GPT-2 export
    with the same input names) and `check-config` on the shipped config."""
    pytest.importorskip("onnxruntime")
    engine, real_export, daemon = _blocks("bash")[2:5]
    for command in engine.splitlines():
        done = _run(command, tmp_path)
        assert done.returncode == 0, (command, done.stderr)
    assert (tmp_path / "ex.sharded" / "report.json").is_file()
    shutil.copy(
        REPO / "tests" / "data" / "models" / "tiny_gpt2" / "model.onnx", tmp_path / "gpt2.onnx"
    )
    done = _run(real_export, tmp_path)
    assert done.returncode == 0, done.stderr
    shipped = (REPO / "sharderd.toml").read_text()
    (tmp_path / "sharderd.toml").write_text(shipped)
    [check] = [line for line in daemon.splitlines() if line.startswith("sharderd check-config")]
    done = _run(check, tmp_path)
    if importlib.util.find_spec("poprt") is None or os.geteuid() == 0:
        # what `run` would refuse here (no PopRT for backend auto, root), each with its fix
        assert done.returncode == 2, done.stderr
        daemon_part = shipped.index("[daemon]")
        amended = shipped[:daemon_part] + shipped[daemon_part:].replace(
            'backend = "auto"', 'backend = "onnxruntime"', 1
        ).replace("allow_root = false", f"allow_root = {str(os.geteuid() == 0).lower()}", 1)
        (tmp_path / "sharderd.toml").write_text(amended)
        done = _run(check, tmp_path)
    assert done.returncode == 0, done.stderr


def test_readme_python_example_runs(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "sharderd.cli", "example-model"],
        cwd=tmp_path,
        check=True,
        timeout=120,
    )
    [python] = _blocks("python")
    done = subprocess.run(
        [sys.executable, "-c", python], cwd=tmp_path, text=True, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
