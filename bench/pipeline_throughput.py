"""Latency and throughput of compiled pipelines: `sharderd shard --backend poprt --optimal-perf`.

Runs against the fake PopRT, whose runtime is a pipeline (stages and inter-IPU links as resources,
tests/fake_poprt/poprt/runtime.py): a lone batch takes every stage and copy in turn, queued
batches leave one per slowest stage. Every benchmarked attempt's latency (runs one at a time) and
throughput (runs queued with ``execute_async``, 2 × stages in flight) are printed, with the rate a
latency-only measurement would imply (batch / latency) beside, and which attempt sharderd kept.

    python bench/pipeline_throughput.py                 # 6-layer transformer on 5 devices
    python bench/pipeline_throughput.py --link 3e8      # a slow inter-IPU link
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _common import (  # bench/ is not a package
    OUT,
    machine,
    machine_markdown,
    markdown_table,
    mini_target_config,
)

from sharderd import examples

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_poprt"
WORK = OUT / "pipeline_throughput"
TILES = 24
CONFIG = mini_target_config(TILES)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=5)
    parser.add_argument("--link", type=float, help="fake link bytes/s (FAKE_POPRT_RUNTIME)")
    parser.add_argument("--max-attempts", type=int, default=6)
    args = parser.parse_args(argv)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    model = examples.save(
        examples.transformer(layers=6, hidden=256, seq=128, vocab=1000), WORK / "mid.onnx"
    )
    config = WORK / "sharderd.toml"
    config.write_text(CONFIG)
    runtime = {"link_bytes_per_s": args.link} if args.link else {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_POPRT")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE), str(REPO)]),
        FAKE_POPRT_TILES=str(TILES),
        FAKE_POPRT_RUNTIME=json.dumps(runtime),
    )
    out = WORK / "out"
    argv_run = [
        sys.executable,
        "-m",
        "sharderd.cli",
        "shard",
        str(model),
        "--devices",
        str(args.devices),
        "--backend",
        "poprt",
        "--config",
        str(config),
        "--optimal-perf",
        "--max-attempts",
        str(args.max_attempts),
        "--out",
        str(out),
        "--quiet",
    ]
    proc = subprocess.run(argv_run, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    report = json.loads((out / "report.json").read_text())
    batch = report["batch_size"]
    rows = []
    for a in report["attempts"]:
        bench = a.get("benchmark")
        if a["outcome"] != "ok" or not bench:
            continue
        chosen = "kept" if a["plan_digest"] == report["plan"]["digest"] else ""
        rows.append(
            [
                a["index"],
                a["label"],
                f"{a['predicted_bottleneck_s'] * 1e6:.1f} µs",
                f"{bench['latency_s'] * 1e3:.2f} ms",
                f"{batch / bench['latency_s']:.0f}/s",
                f"{bench['throughput_per_s']:.0f}/s",
                bench["in_flight"],
                chosen,
            ]
        )
    print(machine_markdown(machine()))
    print()
    print(
        markdown_table(
            [
                "attempt",
                "label",
                "predicted slowest stage",
                "latency (one batch)",
                "batch / latency",
                "throughput (queued)",
                "in flight",
                "",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
