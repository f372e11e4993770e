"""Nodes, folded nodes, compiled ops and the plan of each real export in tests/data/models, at the
manifest's input shapes on N × ipu-mk2 (issue 27): per stage, the predicted time and the FLOPs.

Runs against whichever sharderd is importable, so the same script measures two checkouts:

    python bench/folded_costs.py --devices 4
    python bench/folded_costs.py --devices 4 window_attention unet_attn64   # some of them
    PYTHONPATH=/work/main python3 bench/folded_costs.py --devices 4   # the code before
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def main() -> None:
    from sharderd.config import PlanConfig
    from sharderd.errors import ConfigError, PlanInfeasibleError
    from sharderd.graph.analyze import analyze
    from sharderd.graph.load import load_model
    from sharderd.plan.planner import plan_stages
    from sharderd.target import BUILTIN_TARGETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("names", nargs="*", help="models of the manifest (default: all)")
    args = parser.parse_args()
    manifest = json.loads((MODELS / "manifest.json").read_text())
    target = BUILTIN_TARGETS["ipu-mk2"]
    print(
        "| model | nodes | folded | compiled ops | stage times µs | stage GFLOP | max/mean FLOP |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.names or sorted(manifest):
        entry = manifest[name]
        shapes = {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
        analysis = analyze(
            load_model(MODELS / entry["path"]), PlanConfig(input_shapes=shapes, name_nodes=True)
        )
        n, folded = analysis.flow.num_nodes, analysis.folded_nodes
        try:
            plan = plan_stages(analysis, target, args.devices, safety_margin=1.15)
        except (ConfigError, PlanInfeasibleError) as exc:  # too few nodes, or no fit
            print(f"| {name} | {n} | {folded} | {n - folded} | {type(exc).__name__} | | |")
            continue
        times = " / ".join(f"{s.time_s * 1e6:.1f}" for s in plan.stages)
        flops = [s.flops for s in plan.stages]
        gflop = " / ".join(f"{f / 1e9:.3f}" for f in flops)
        mean = sum(flops) / len(flops)
        ratio = max(flops) / mean if mean else float("nan")
        print(f"| {name} | {n} | {folded} | {n - folded} | {times} | {gflop} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
