"""The checks ``stock_exports.py`` runs on each export: onnxruntime opens and runs it once, and
``sharderd plan`` plans it. Each runs in a fresh process, measured alone (``_common.run_measured``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _common import run_measured, sharderd_exe

ORT_CHECK = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort

path, shapes = sys.argv[1], json.loads(sys.argv[2])
start = time.perf_counter()
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
result = {"load_s": round(time.perf_counter() - start, 2)}
rng = np.random.default_rng(0)
feed = {}
for arg in session.get_inputs():
    shape = shapes[arg.name]
    if arg.type != "tensor(int64)":
        feed[arg.name] = rng.standard_normal(shape, dtype=np.float32)
    elif "mask" in arg.name:
        feed[arg.name] = np.ones(shape, np.int64)
    elif "type" in arg.name:
        feed[arg.name] = np.zeros(shape, np.int64)
    else:
        feed[arg.name] = rng.integers(0, 1000, shape)
start = time.perf_counter()
values = session.run(None, feed)
result["run_s"] = round(time.perf_counter() - start, 2)
result["output_shapes"] = {o.name: list(v.shape) for o, v in zip(session.get_outputs(), values)}
result["finite"] = bool(all(np.isfinite(v).all() for v in values if v.dtype.kind == "f"))
print(json.dumps(result))
"""
"""Open the model in onnxruntime and run it once at the plan shapes: float inputs standard normal,
int64 masks ones, token types zeros, other int64 inputs (token ids) in [0, 1000)."""


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def check_ort(path: Path, plan_shapes: dict[str, list[int]]) -> dict[str, Any]:
    """``ORT_CHECK`` in a fresh process: whether it ran, load and run time, peak RSS."""
    run = run_measured([sys.executable, "-c", ORT_CHECK, str(path), json.dumps(plan_shapes)])
    result: dict[str, Any] = {"ok": run.exit_code == 0, "peak_rss_bytes": run.peak_rss_bytes}
    if run.exit_code == 0:
        result |= json.loads(run.stdout)
    else:
        result["error"] = tail(run.stderr)
    return result


def check_plan(path: Path, devices: int, flags: str) -> dict[str, Any]:
    """``sharderd plan --json`` in a fresh process: exit code, wall, CPU, peak RSS, and from the
    report the status, bottleneck, stage times, FLOPs, unknown-size tensors and warnings."""
    argv = [sharderd_exe(), "plan", str(path), "--devices", str(devices), *flags.split()]
    run = run_measured([*argv, "--json"])
    result: dict[str, Any] = {
        "command": " ".join(["sharderd", *argv[1:]]),
        "exit_code": run.exit_code,
        "wall_s": round(run.wall_s, 2),
        "cpu_s": round(run.user_s + run.sys_s, 2),
        "peak_rss_bytes": run.peak_rss_bytes,
    }
    try:
        report = run.json()
    except ValueError:
        return result | {"error": tail(run.stderr)}
    plan = report.get("plan") or {}
    model = report.get("model") or {}
    return result | {
        "status": report.get("status"),
        "bottleneck_us": round(plan["bottleneck_s"] * 1e6, 1) if "bottleneck_s" in plan else None,
        "stage_us": [round(s["time_s"] * 1e6, 1) for s in plan.get("stages", [])],
        "flops": model.get("flops"),
        "unknown_size_tensors": model.get("unknown_size_tensors"),
        "warnings": report.get("warnings", []),
        "error": report.get("error"),
    }
