"""The exporter family of ``plan_scale.py``: shape propagation and planning on exporter-style GPT-2 graphs.

Models come from ``exporter_graph.py`` (symbolic batch/sequence, shape subgraphs in every layer),
cached in ``bench/out/``. Per size, two fresh processes:

- the real CLI, ``sharderd plan MODEL --devices N --dim sequence=128 --json``: wall time, CPU and
  peak RSS of the child alone (``wait4``);
- an in-process split: ``load_model``, then ``sharderd.graph.shapes.shape_info`` alone (shape
  propagation), then ``analyze`` (which propagates again, then costs) and ``make_plan``; planning
  = (analyze − shape propagation) + plan. The engine before (ONNX shape inference with data
  propagation on the same inference copy) is timed in the same process, with the tensors it leaves
  unknown.

The GPT-2-XL case has real XL dims (48 layers, hidden 1600, vocab 50257: 9.3k nodes) and its
6.55 GB of weights in a sparse external data file, as ``examples.large_external_model`` does.

    python bench/plan_scale.py --family exporter            # 10k, 100k nodes and GPT-2 XL
    python bench/plan_scale.py --family exporter --quick    # 10k and GPT-2 XL
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from _common import (
    OUT,
    Run,
    machine,
    machine_markdown,
    markdown_table,
    run_measured,
    sharderd_exe,
    write_json,
)
from exporter_graph import GPT2_XL, Dims, exporter_gpt2, layers_for, save

SIZES = (10_000, 100_000)
QUICK_MAX = 10_000
DEVICES = 8
SEQUENCE = 128
SMALL = {"hidden": 64, "heads": 4, "vocab": 256}
"""Small layers for the node-count sizes: the benchmark is about graph size, not bytes."""
WALL_TARGET_XL_S = 3.0
RSS_TARGET_XL = 2**30
"""Issue 10: GPT-2 XL size plans in < 3 s wall and < 1 GB peak RSS with dims given."""

_AT_LEAST = re.compile(r"At least (\d+) devices")

_SPLIT_CHILD = r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
import onnx
from sharderd.config import Config, PlanConfig
from sharderd.engine import make_plan
from sharderd.graph.analyze import analyze
from sharderd.graph.input_dims import fix_input_dims
from sharderd.graph.load import load_model
from sharderd.graph.propagate import inference_copy
from sharderd.graph.shapes import shape_info
t1 = time.perf_counter()
dims = {"sequence": int(sys.argv[3])}
loaded = load_model(Path(sys.argv[1]))
t2 = time.perf_counter()
shapes = shape_info(loaded.model, batch_size=1, dims=dims)
t3 = time.perf_counter()
config = Config()
plan_config = PlanConfig(dims=dims)
analysis = analyze(loaded, plan_config)
t4 = time.perf_counter()
plan = make_plan(analysis, config.target(None), int(sys.argv[2]), plan_config)
t5 = time.perf_counter()
light = inference_copy(loaded.model)
fix_input_dims(light.graph, batch_size=1, dims=dims, input_shapes={})
t6 = time.perf_counter()
old = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
t7 = time.perf_counter()
known = set()
for v in (*old.graph.input, *old.graph.output, *old.graph.value_info):
    d = v.type.tensor_type.shape.dim
    if v.type.tensor_type.HasField("shape") and all(x.HasField("dim_value") for x in d):
        known.add(v.name)
known |= {t.name for t in old.graph.initializer}
produced = [o for n in old.graph.node for o in n.output if o]
print(json.dumps({
    "import": t1 - t0, "load": t2 - t1, "shapes": t3 - t2, "analyze": t4 - t3, "plan": t5 - t4,
    "engine": shapes.engine, "unknown": len(analysis.costs.unknown_tensors),
    "onnx_shapes": t7 - t6, "onnx_unknown": sum(1 for o in produced if o not in known),
}))
"""


@dataclass(frozen=True, slots=True)
class Model:
    label: str
    dims: Dims
    nodes: int
    path: Path
    external_bytes: int


@dataclass(frozen=True, slots=True)
class Result:
    model: Model
    devices: int
    cli: Run
    split: dict[str, Any]


def cached(label: str, dims: Dims, *, external: bool) -> Model:
    """Build and save once; later runs reuse the file (its node count is re-read)."""
    stem = f"exporter_L{dims.layers}_h{dims.hidden}_v{dims.vocab}" + ("_ext" if external else "")
    folder = OUT / stem
    path = folder / f"{stem}.onnx"
    if not path.is_file():  # save() writes the data file first: a model file implies its data
        folder.mkdir(parents=True, exist_ok=True)
        save(exporter_gpt2(dims), path, external=external)
    nodes = len(onnx.load_model(str(path), load_external_data=False).graph.node)
    data = path.with_name(f"{path.stem}.data")
    return Model(label, dims, nodes, path, data.stat().st_size if data.is_file() else 0)


def plan_cli(model: Model, devices: int) -> tuple[Run, int]:
    """``sharderd plan`` with the sequence given; with too few devices, rerun on the count it asks for."""
    argv = (
        sharderd_exe(),
        "plan",
        str(model.path),
        "--devices",
        str(devices),
        "--dim",
        f"sequence={SEQUENCE}",
        "--json",
    )
    run = run_measured(argv)
    if run.exit_code == 3 and (need := _needed(run)) is not None and need != devices:
        return plan_cli(model, need)
    if run.exit_code != 0:
        sys.exit(f"{' '.join(argv)} failed ({run.exit_code}):\n{run.stderr}")
    return run, devices


def _needed(run: Run) -> int | None:
    found = _AT_LEAST.search(run.stderr)
    return int(found.group(1)) if found else None


def split(model: Model, devices: int) -> dict[str, Any]:
    run = run_measured(
        (sys.executable, "-c", _SPLIT_CHILD, str(model.path), str(devices), str(SEQUENCE))
    )
    if run.exit_code != 0:
        sys.exit(f"phase split failed on {model.path}:\n{run.stderr}")
    return {**run.json(), "peak_rss": run.peak_rss_bytes}


def bench(model: Model) -> Result:
    cli, devices = plan_cli(model, DEVICES)
    result = Result(model, devices, cli, split(model, devices))
    print(
        f"  {model.label}: {model.nodes} nodes, {devices} devices: {cli.wall_s:.2f} s, "
        f"{cli.peak_rss_bytes / 2**20:.0f} MiB; shapes {result.split['shapes']:.2f} s",
        file=sys.stderr,
    )
    return result


def table(results: list[Result]) -> str:
    rows = []
    for r in results:
        s = r.split
        planning = s["analyze"] - s["shapes"] + s["plan"]
        rows.append(
            [
                r.model.label,
                r.model.nodes,
                f"{r.model.external_bytes / 1e9:.2f} GB" if r.model.external_bytes else "inline",
                r.devices,
                f"{r.cli.wall_s:.2f}",
                f"{r.cli.user_s + r.cli.sys_s:.2f}",
                f"{r.cli.peak_rss_bytes / 2**20:.0f}",
                f"{s['shapes']:.2f}",
                f"{planning:.2f}",
                s["unknown"],
                f"{s['onnx_shapes']:.2f}",
                s["onnx_unknown"],
            ]
        )
    header = [
        "model",
        "nodes",
        "weights",
        "devices",
        "`sharderd plan` wall s",
        "CPU s",
        "peak RSS MiB",
        "shape propagation s",
        "planning s (analyze − shapes + plan)",
        "unknown tensors",
        "before: ONNX inference s",
        "before: unknown tensors",
    ]
    return markdown_table(header, rows)


def main(args: argparse.Namespace) -> int:
    sizes = args.sizes or [n for n in SIZES if not args.quick or n <= QUICK_MAX]
    print(f"building/reusing exporter-style models in {OUT}", file=sys.stderr)
    models = [
        cached(f"exporter {n // 1000}k", Dims(layers=layers_for(n), **SMALL), external=False)
        for n in sizes
    ]
    models.append(cached("GPT-2 XL size", GPT2_XL, external=True))
    results = [bench(m) for m in models]
    info = machine()
    print(machine_markdown(info) + "\n")
    print(
        f"`sharderd plan MODEL --devices {DEVICES} --dim sequence={SEQUENCE} --json` (more devices where "
        f"{DEVICES} do not fit), target ipu-mk2; one fresh process per number.\n"
    )
    print(table(results) + "\n")
    xl = results[-1]
    print(
        f"GPT-2 XL size: {xl.cli.wall_s:.2f} s wall (target < {WALL_TARGET_XL_S:.0f} s), "
        f"{xl.cli.peak_rss_bytes / 2**20:.0f} MiB peak RSS (target < {RSS_TARGET_XL / 2**20:.0f} MiB).\n"
    )
    write_json(
        OUT / "plan_scale_exporter.json",
        {
            "machine": info,
            "cases": [
                {
                    "label": r.model.label,
                    "nodes": r.model.nodes,
                    "layers": r.model.dims.layers,
                    "hidden": r.model.dims.hidden,
                    "external_bytes": r.model.external_bytes,
                    "devices": r.devices,
                    "wall_s": r.cli.wall_s,
                    "cpu_s": r.cli.user_s + r.cli.sys_s,
                    "peak_rss_bytes": r.cli.peak_rss_bytes,
                    "split": r.split,
                }
                for r in results
            ],
        },
    )
    return 0
