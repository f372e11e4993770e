"""Balance beyond the bottleneck (issue 39): per real export and device count, the predicted
bottleneck, every stage's time, FLOPs max/mean across stages, what holds the bottleneck, the
fewest devices for that throughput, and the planner's time, in process (load and analysis once per
model, excluded from the times).

Reads a manifest of exports: ``/work/exports/stock/manifest.json`` (``sharderd_flags`` gives each
model's ``--input-shape`` flags) or tests/data/models' own (``ort_input_shapes``). Runs against the
``sharderd`` the interpreter imports, so the same script measures two checkouts (each with its own
venv) one after the other; fields a checkout does not have are left empty.

    python bench/balance.py --manifest /work/exports/stock/manifest.json --out bench/out/balance_after.json
    python bench/balance.py --small --models tiny_gpt2 tiny_unet
    python bench/balance.py --compare bench/out/balance_before.json bench/out/balance_after.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "tests" / "data" / "models" / "manifest.json"
STOCK = Path("/work/exports/stock/manifest.json")
HOLD_SHARE = 0.5
"""``plan.held.HOLD_SHARE``, restated so the before checkout (which has no such module) is judged
by the same rule: the slowest stage is held when one unmovable cost is half of it."""


def shapes_of(entry: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if "ort_input_shapes" in entry:
        return {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
    flags = shlex.split(entry.get("sharderd_flags") or "")
    shapes = {}
    for flag, value in itertools.pairwise(flags):
        if flag == "--input-shape":
            name, dims = value.split("=")
            shapes[name] = tuple(int(d) for d in dims.split(","))
    return shapes


def held_cost(analysis: Any, target: Any, plan: Any) -> tuple[float, str]:
    """The dearest unmovable cost in the slowest stage (``bounds.node_work``), and its node."""
    import numpy as np

    from sharderd.plan.bounds import node_work
    from sharderd.plan.ordered_costs import calibrated_compute_s

    node_s = node_work(analysis, target, calibrated_compute_s(analysis, target, None)).node_s
    members = np.flatnonzero(plan.assignment == plan.slowest_stage)
    v = int(members[np.argmax(node_s[members])])
    return float(node_s[v]), analysis.flow.node_names[v]


def cell(analysis: Any, target: Any, config: Any, devices: int, repeat: int) -> dict[str, Any]:
    from sharderd.engine import make_plan

    walls, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = make_plan(analysis, target, devices, config.plan)
        walls.append(time.perf_counter() - t0)
    assert plan is not None
    times = [s.time_s for s in plan.stages]
    flops = [s.flops for s in plan.stages]
    mean = sum(flops) / len(flops)
    rest = [f for i, f in enumerate(flops) if i != plan.slowest_stage]
    rest_mean = sum(rest) / len(rest) if rest else 0.0
    cost, node = held_cost(analysis, target, plan)
    holder = getattr(plan, "held_by", None)
    timings = dict(plan.timings_s)
    return {
        "devices": devices,
        "method": plan.method,
        "bottleneck_us": plan.bottleneck_s * 1e6,
        "bound_us": plan.lower_bound_s * 1e6,
        "stages_us": [t * 1e6 for t in times],
        "flops_max_mean": max(flops) / mean if mean > 0 else None,
        "flops_max_mean_others": max(rest) / rest_mean if rest_mean > 0 else None,
        "held": cost >= HOLD_SHARE * plan.bottleneck_s,
        "held_node": node,
        "held_us": cost * 1e6,
        "held_by": None if holder is None else f"{holder.kind} {holder.node}",
        "held_by_us": None if holder is None else holder.time_s * 1e6,
        "fewest_devices": getattr(plan, "fewest_devices", None),
        "planner_s": timings.get("total"),
        "fewest_s": timings.get("fewest_devices"),
        "make_plan_s": min(walls),
        "claim": plan.claim,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from sharderd.config import Config, PlanConfig
    from sharderd.errors import NoSplitError
    from sharderd.graph.analyze import analyze
    from sharderd.graph.load import load_model

    manifest_path = SMALL if args.small else Path(args.manifest)
    manifest = json.loads(manifest_path.read_text())
    config = Config()
    target = config.target(None)
    rows = []
    for name in args.models or sorted(manifest):
        entry = manifest[name]
        path = entry.get("path") or entry.get("file")
        if not path or not (manifest_path.parent / path).is_file():
            print(f"{name}: no model file, skipped", file=sys.stderr)
            continue
        t0 = time.perf_counter()
        analysis = analyze(
            load_model(manifest_path.parent / path),
            PlanConfig(input_shapes=shapes_of(entry), name_nodes=True),
        )
        analyze_s = time.perf_counter() - t0
        for devices in args.devices:
            try:
                found = cell(analysis, target, config, devices, args.repeat)
            except NoSplitError as err:
                print(f"{name} × {devices}: {err.message}", file=sys.stderr)
                continue
            row = {
                "model": name,
                "nodes": analysis.flow.num_nodes,
                "analyze_s": analyze_s,
                **found,
            }
            rows.append(row)
            print(
                f"{name} × {devices}: {row['bottleneck_us']:.2f} µs ({row['method']}), "
                f"FLOPs max/mean {row['flops_max_mean'] or 0:.2f}, planner {row['planner_s']:.2f} s",
                file=sys.stderr,
            )
        del analysis
    return rows


def compare(before_path: Path, after_path: Path) -> None:
    before = {(r["model"], r["devices"]): r for r in json.loads(before_path.read_text())["rows"]}
    after = json.loads(after_path.read_text())["rows"]
    print(
        "| model | devices | bottleneck µs before → after | FLOPs max/mean before → after "
        "| same, other stages | held by (after) | fewest devices | planner s before → after "
        "| fewest search s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in after:
        b = before.get((r["model"], r["devices"]))
        if b is None:
            continue

        def ratio(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        worse = r["bottleneck_us"] > b["bottleneck_us"] * (1 + 1e-9)
        held = f"{r['held_by']} ({r.get('held_by_us') or 0:,.1f} µs)" if r.get("held_by") else "-"
        search = "-" if r.get("fewest_s") is None else f"{r['fewest_s']:.2f}"
        print(
            f"| {r['model']} | {r['devices']} | {b['bottleneck_us']:,.2f} → {r['bottleneck_us']:,.2f}"
            f"{' **worse**' if worse else ''} | {ratio(b['flops_max_mean'])} → "
            f"{ratio(r['flops_max_mean'])} | {ratio(b.get('flops_max_mean_others'))} → "
            f"{ratio(r.get('flops_max_mean_others'))} | {held} | {r.get('fewest_devices') or '-'} "
            f"| {b['planner_s']:.3f} → {r['planner_s']:.3f} | "
            f"{search} |"
        )
    print()
    for r in after:
        b = before.get((r["model"], r["devices"]))
        if b is None:
            continue
        print(
            f"- {r['model']} × {r['devices']}: before "
            f"{', '.join(f'{x:,.1f}' for x in b['stages_us'])}; after "
            f"{', '.join(f'{x:,.1f}' for x in r['stages_us'])}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=str(STOCK))
    parser.add_argument("--small", action="store_true", help="tests/data/models' manifest")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=1, help="plans per cell; the fastest counts")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return 0
    rows = run(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
