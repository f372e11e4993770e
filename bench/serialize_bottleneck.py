"""Does any node's own time hold the bottleneck up, and does serializing it pay? On the real exports
in tests/data/models (at the manifest's input shapes) and the ``wide_head`` example, 4 and 8
devices of ipu-mk2 and cpu, in process: the dearest splittable MatMul/Gemm's ``c(v)`` over the
balanced share ``W / N``, the pieces ``bottleneck_pieces`` asks for, the first plan's bottleneck
before, the floor no split in pieces beats, the first plan in pieces (when the floor lets one be
made), whether ``worth_keeping`` kept it, and what deciding cost after the analysis
(``serialize_bottleneck.decide``: pricing and plans; nothing is written).

    python bench/serialize_bottleneck.py
    python bench/serialize_bottleneck.py --devices 4 --models gpt_decoder --targets ipu-mk2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "data" / "models"
OUT = Path(__file__).resolve().parent / "out"


def _dearest_ratio(path: Path, config: object, target: object, devices: int) -> float:
    """max c(v) / (W / N) over the MatMul/Gemm nodes with a constant 2-D weight."""
    from sharderd.engine import analyze_file
    from sharderd.plan.bounds import node_work
    from sharderd.plan.ordered_costs import calibrated_compute_s
    from sharderd.shard.serialize import splittable

    analysis = analyze_file(path, config)  # type: ignore[arg-type]
    work = node_work(analysis, target, calibrated_compute_s(analysis, target, None))  # type: ignore[arg-type]
    model = analysis.model
    ratios = [
        float(work.node_s[i]) / (work.total_s / devices)
        for i, node in enumerate(model.graph.node)
        if splittable(model, node) == "columns"
    ]
    return max(ratios, default=0.0)


def main() -> None:
    from sharderd import examples
    from sharderd.config import Config, PlanConfig
    from sharderd.engine import analyze_file
    from sharderd.shard.serialize_bottleneck import decide

    manifest = json.loads((MODELS / "manifest.json").read_text())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--targets", nargs="+", default=["ipu-mk2", "cpu"])
    parser.add_argument("--models", nargs="+", default=[*sorted(manifest), "wide_head"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # wide_head's file only
        for name in args.models:
            if name == "wide_head":
                path = examples.save(examples.wide_head(), Path(tmp) / "wide_head.onnx")
                plan_config = PlanConfig()
            else:
                entry = manifest[name]
                path = MODELS / entry["path"]
                shapes = {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
                plan_config = PlanConfig(input_shapes=shapes, name_nodes=True)
            for target_name in args.targets:
                target = Config().target(target_name)
                for devices in args.devices:
                    analysis = analyze_file(path, plan_config)
                    t0 = time.perf_counter()
                    done = decide(analysis, plan_config, target, devices)
                    spent = time.perf_counter() - t0
                    trial = done.trial
                    rows.append(
                        {
                            "model": name,
                            "target": target_name,
                            "devices": devices,
                            "dearest_over_share": _dearest_ratio(
                                path, plan_config, target, devices
                            ),
                            "pieces": {} if trial is None else {n: k for n, _, k in trial.pieces},
                            "before_us": trial and trial.before_s * 1e6,
                            "floor_us": trial and trial.floor_s * 1e6,
                            "after_us": trial and trial.after_s and trial.after_s * 1e6,
                            "kept": bool(trial and trial.kept),
                            "decide_s": spent,
                        }
                    )
    print(
        "| model | target | N | dearest MatMul c(v) / (W/N) | pieces tried | bottleneck before µs "
        "| floor in pieces µs | after µs | kept | deciding s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tried = ", ".join(f"`{k}` × {v}" for k, v in r["pieces"].items()) or "–"
        cells = [r[k] for k in ("before_us", "floor_us")]
        before, floor = ("–" if x is None else f"{x:.1f}" for x in cells)
        after = "–" if r["after_us"] is None else f"{r['after_us']:.1f}"
        if r["floor_us"] is not None and r["after_us"] is None:
            after = "not planned"
        print(
            f"| {r['model']} | {r['target']} | {r['devices']} | {r['dearest_over_share']:.2f} "
            f"| {tried} | {before} | {floor} | {after} | {'yes' if r['kept'] else 'no'} "
            f"| {r['decide_s']:.2f} |"
        )
    OUT.mkdir(exist_ok=True)
    (OUT / "serialize_bottleneck.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
