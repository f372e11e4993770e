"""Plan quality and time on the real exports in tests/data/models: which method produced each
plan and what it proves (``plan.claim``), at the manifest's input shapes, 4 and 8 × ipu-mk2, in
process ("plan s" excludes load and analysis).

    python bench/plan_exports.py
    python bench/plan_exports.py --devices 4 --models tiny_bert tiny_gpt2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"
OUT = Path(__file__).resolve().parent / "out"


def main() -> None:
    from sharderd.config import Config, PlanConfig
    from sharderd.engine import make_plan
    from sharderd.graph.analyze import analyze
    from sharderd.graph.load import load_model

    manifest = json.loads((MODELS / "manifest.json").read_text())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--models", nargs="+", default=sorted(manifest))
    args = parser.parse_args()
    config = Config()
    target = config.target(None)
    rows = []
    for name in args.models:
        entry = manifest[name]
        shapes = {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
        analysis = analyze(
            load_model(MODELS / entry["path"]), PlanConfig(input_shapes=shapes, name_nodes=True)
        )
        for devices in args.devices:
            t0 = time.perf_counter()
            plan = make_plan(analysis, target, devices, config.plan)
            rows.append(
                {
                    "model": name,
                    "nodes": analysis.flow.num_nodes,
                    "devices": devices,
                    "plan_s": time.perf_counter() - t0,
                    "method": plan.method,
                    "proven_optimal": plan.proven_optimal,
                    "bottleneck_us": plan.bottleneck_s * 1e6,
                    "bound_us": plan.lower_bound_s * 1e6,
                    "orders_us": {k: v and v * 1e6 for k, v in plan.orders_tried.items()},
                    "claim": getattr(plan, "claim", ""),
                }
            )
    print(
        "| model | nodes | devices | plan s | method | proven optimal | bottleneck µs | bound µs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['nodes']} | {r['devices']} | {r['plan_s']:.3f} | {r['method']} "
            f"| {'yes' if r['proven_optimal'] else 'no'} | {r['bottleneck_us']:.2f} | {r['bound_us']:.2f} |"
        )
    print()
    for r in rows:
        print(f"- {r['model']} × {r['devices']}: {r['claim']}")
    OUT.mkdir(exist_ok=True)
    (OUT / "plan_exports.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
