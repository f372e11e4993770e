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


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The sharderd modules ``name`` imports anywhere in its file (under ``TYPE_CHECKING`` and
    inside functions too): an import that only a type checker or a call runs still ties the two."""
    import ast

    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    # The root package re-exports the API (``sharderd.plan``, ``sharderd.shard``): ``from sharderd
    # import __version__`` reads a constant of it, not one of its modules.
    return {m for m in found if m in modules and m not in (name, "sharderd")}


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle in the package (Tarjan's strongly connected components of the module graph)."""
    files = {}
    for path in (REPO / "sharderd").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _imports(name, path, set(files)) for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []
