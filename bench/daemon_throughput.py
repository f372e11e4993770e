"""Pickup latency and throughput of ``sharderd run`` (backend none: intake + planning, no compiles).

Runs the real daemon on temporary folders and reads its JSON log (the same reader the tests use):

- *pickup latency*: from the moment a file is complete in the inbox to its ``job.claimed`` line,
  for a model renamed in (the fast path: inotify's ``IN_MOVED_TO``) in three ways, and for one
  written in place (it must sit unchanged for ``settle_seconds``), one at a time, each waited for
  before the next; the count of renames claimed in under 1 s is printed per style;
- *throughput*: 100 different small models (``examples.chain(nodes=20, hidden=8)``) renamed in at
  once, from the first rename to the last ``job.succeeded``;
- *idle CPU*: utime + stime of the daemon over 20 s with nothing to do.

Prints a Markdown table; raw numbers go to ``bench/out/daemon_throughput.json``.

    python bench/daemon_throughput.py                 # settle_seconds 5 (the default), 100 models
    python bench/daemon_throughput.py --settle 1 --models 20 --repeat 5
    python bench/daemon_throughput.py --repeat 20 --in-place 3 --models 20 --idle 5   # BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # bench/ is on sys.path
    OUT,
    machine,
    machine_markdown,
    markdown_table,
    write_json,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from daemon_helpers import DaemonProcess, chain_model, cpu_seconds, save_model, ts, write_config  # noqa: E402

STYLES = (
    "rename, written earlier",
    "write + rename at once",
    "cp inbox/.x.part && mv (systemd README)",
    "written in place",
)
"""How a file arrives: renamed in from another folder long after its last write; written elsewhere
and renamed in within the same clock tick (ctime == mtime); the systemd README's recipe, a copy to
a staging name in the inbox and a ``mv`` at once (``cp`` and ``mv`` as subprocesses); written
straight into the inbox. The first three are renames (``IN_MOVED_TO``: claimed after one confirm
look), the last must sit unchanged for ``settle_seconds``."""


def pickup(root: Path, settle: float, repeat: int, in_place: int) -> dict[str, list[float]]:
    """Seconds from "complete" to ``job.claimed``, per delivery style."""
    config = write_config(root, settle_seconds=settle, rescan_interval=30.0)
    latencies: dict[str, list[float]] = {style: [] for style in STYLES}
    staged = {
        (k, style): save_model(chain_model(1000 + 10 * k + n), root / "models" / f"s{n}-{k}.onnx")
        for k in range(repeat)
        for n, style in enumerate(STYLES)
        if style != STYLES[3] or k < in_place
    }
    daemon = DaemonProcess(config)
    try:
        daemon.ready()
        for (_, style), path in staged.items():
            name = path.stem
            if style == STYLES[0]:
                path.rename(root / "inbox" / path.name)
            elif style == STYLES[1]:
                fresh = path.with_name(f".{path.name}.part")
                fresh.write_bytes(path.read_bytes())
                fresh = fresh.rename(root / "inbox" / path.name)
            elif style == STYLES[2]:
                part = root / "inbox" / f".{path.name}.part"
                subprocess.run(["cp", str(path), str(part)], check=True)
                subprocess.run(["mv", str(part), str(root / "inbox" / path.name)], check=True)
            else:
                (root / "inbox" / path.name).write_bytes(path.read_bytes())
            complete = time.time()
            claimed = daemon.wait_for("job.claimed", name=name, timeout=settle + 30)[0]
            latencies[style].append(ts(claimed) - complete)
            daemon.wait_for("job.succeeded", name=name, timeout=60)
        assert daemon.stop() == 0
    finally:
        daemon.close()
    return latencies


def idle_cpu(root: Path, seconds: float) -> float:
    """CPU seconds the daemon uses per minute while idle (default watch mode and rescan interval)."""
    daemon = DaemonProcess(write_config(root, rescan_interval=30.0))
    try:
        daemon.ready()
        daemon.pump(1.0)
        before = cpu_seconds(daemon.pid)
        daemon.pump(seconds)
        used = cpu_seconds(daemon.pid) - before
        assert daemon.stop() == 0
    finally:
        daemon.close()
    return used * 60 / seconds


def throughput(root: Path, count: int, settle: float) -> dict[str, Any]:
    """``count`` models renamed in at once: wall time to the last result, jobs per second."""
    config = write_config(root, settle_seconds=settle, rescan_interval=30.0)
    staged = [save_model(chain_model(k), root / "models" / f"m{k:03d}.onnx") for k in range(count)]
    daemon = DaemonProcess(config)
    try:
        daemon.ready()
        start = time.time()
        for path in staged:
            path.rename(root / "inbox" / path.name)
        done = daemon.wait_for("job.succeeded", count=count, timeout=60 + 5 * count)
        claims = daemon.events("job.claimed")
        assert len(claims) == count and not daemon.events("job.failed"), (
            "every job must finish once"
        )
        wall = max(ts(line) for line in done) - start
        assert daemon.stop() == 0
    finally:
        daemon.close()
    return {
        "models": count,
        "wall_s": wall,
        "jobs_per_s": count / wall,
        "first_claim_s": min(ts(line) for line in claims) - start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--settle", type=float, default=5.0, help="settle_seconds (default 5, the daemon's)"
    )
    parser.add_argument(
        "--models", type=int, default=100, help="models dropped at once for throughput"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="pickup measurements per rename style"
    )
    parser.add_argument(
        "--in-place", type=int, default=5, help="pickup measurements of in-place writes"
    )
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sharderd-bench-") as tmp:
        latencies = pickup(
            Path(tmp) / "pickup", args.settle, args.repeat, min(args.in_place, args.repeat)
        )
        rate = throughput(Path(tmp) / "throughput", args.models, args.settle)
        idle = idle_cpu(Path(tmp) / "idle", args.idle)
    rows = [
        [
            style,
            len(v),
            f"{statistics.median(v):.3f}",
            f"{max(v):.3f}",
            f"{sum(x < 1.0 for x in v)} of {len(v)}",
        ]
        for style, v in latencies.items()
        if v
    ]
    print(machine_markdown(machine()))
    print(f"\nsettle_seconds = {args.settle:g}, backend none\n")
    print(
        markdown_table(
            ["pickup (complete → job.claimed)", "n", "median s", "max s", "claimed < 1 s"], rows
        )
    )
    print()
    print(
        markdown_table(
            [
                "models at once",
                "wall s (first rename → last job.succeeded)",
                "jobs/s",
                "first claim s",
            ],
            [
                [
                    rate["models"],
                    f"{rate['wall_s']:.1f}",
                    f"{rate['jobs_per_s']:.2f}",
                    f"{rate['first_claim_s']:.2f}",
                ]
            ],
        )
    )
    print(f"\nidle: {idle:.3f} CPU seconds per minute (inotify watch, rescan every 30 s)")
    write_json(
        OUT / "daemon_throughput.json",
        {
            "machine": machine(),
            "settle_seconds": args.settle,
            "pickup_s": latencies,
            "throughput": rate,
            "idle_cpu_s_per_min": idle,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
