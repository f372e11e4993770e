"""Shared helpers for the bench scripts: run a command in a fresh process and measure it honestly.

Peak RSS comes from ``wait4`` on that one child, spawned by a bare launcher process, so neither the
bench process nor earlier runs leak into the number (``RUSAGE_CHILDREN`` would be a running maximum
over every child ever reaped).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OUT",
    "Run",
    "disk_usage",
    "fmt_bytes",
    "machine",
    "machine_markdown",
    "markdown_table",
    "mini_target_config",
    "run_measured",
    "sharderd_exe",
    "write_json",
]

OUT = Path(__file__).resolve().parent / "out"
"""Cache of generated models and raw results; gitignored (``/bench/out/``)."""


@dataclass(frozen=True, slots=True)
class Run:
    argv: tuple[str, ...]
    exit_code: int
    wall_s: float
    user_s: float
    sys_s: float
    peak_rss_bytes: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """The child's stdout parsed as JSON (``--json`` commands)."""
        return json.loads(self.stdout)


def sharderd_exe() -> str:
    """The console script beside this interpreter: a pyenv/asdf shim would add its own start-up."""
    beside = Path(sys.executable).parent / "sharderd"
    if beside.is_file():
        return str(beside)
    found = shutil.which("sharderd")
    if found is None:
        raise SystemExit("sharderd is not installed: run `pip install -e .` in the repository")
    return found


_LAUNCHER = r"""
import json, os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    json.dump([os.waitstatus_to_exitcode(status), wall, usage.ru_utime, usage.ru_stime,
               usage.ru_maxrss], f)
"""
"""Spawns the command and reports its ``wait4`` rusage. Needed because Linux folds the memory
high-water mark of the address space a child is forked from into its ``ru_maxrss``: spawned straight
from a bench process that just built a 100k-node model, every child would "peak" at 2 GiB. This
launcher is a bare interpreter (``-I -S``, ~10 MiB), below any child we measure."""


def run_measured(argv: Sequence[str]) -> Run:
    """Run ``argv`` to completion; wall time, CPU times and this child's own peak RSS.

    stdout/stderr go to temp files rather than pipes, so a chatty child never blocks on a full pipe
    while we wait. The child inherits our working directory: pass absolute paths.
    """
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile(suffix=".json") as result,
    ):
        actions = [
            (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
        ]
        launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, result.name, *argv]
        pid = os.posix_spawn(sys.executable, launcher, dict(os.environ), file_actions=actions)
        _, status = os.waitpid(pid, 0)
        try:
            code, wall, user, system, maxrss_kib = json.loads(Path(result.name).read_text())
        except ValueError:
            err.seek(0)
            raise RuntimeError(
                f"could not run {argv[0]} (launcher exit {status}): {err.read().decode()}"
            ) from None
        out.seek(0)
        err.seek(0)
        return Run(
            argv=tuple(argv),
            exit_code=code,
            wall_s=wall,
            user_s=user,
            sys_s=system,
            peak_rss_bytes=maxrss_kib * 1024,  # Linux reports KiB
            stdout=out.read().decode("utf-8", "replace"),
            stderr=err.read().decode("utf-8", "replace"),
        )


def disk_usage(path: Path) -> int:
    """Bytes actually allocated under ``path`` (st_blocks), so sparse files count as what they use."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine() -> dict[str, Any]:
    """What the numbers were measured on; goes into BENCHMARKS.md beside every table."""
    import numpy
    import onnx

    import sharderd

    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(),
        "ram_bytes": _ram_bytes(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "onnx": onnx.__version__,
        "numpy": numpy.__version__,
        "sharderd": sharderd.__version__,
        "loadavg": os.getloadavg(),
    }


def machine_markdown(info: Mapping[str, Any]) -> str:
    return (
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {fmt_bytes(info['ram_bytes'])} RAM, "
        f"Linux {info['kernel']}; Python {info['python']}, onnx {info['onnx']}, "
        f"numpy {info['numpy']}, sharderd {info['sharderd']}. Load average when the table was "
        f"printed: {info['loadavg'][0]:.2f} (1 min), {info['loadavg'][2]:.2f} (15 min)."
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def mini_target_config(tiles: int, tile_bytes: int = 638_976) -> str:
    """A sharderd.toml whose default target is a ``tiles``-tile Mk2 ("mini"), so small models
    need several devices against the fake PopRT."""
    return (
        f'[target]\nname = "mini"\n\n[targets.mini]\nbase = "ipu-mk2"\ntiles = {tiles}\n'
        f"memory_bytes = {tiles * tile_bytes}\n"
    )
