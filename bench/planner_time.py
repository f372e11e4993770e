"""In-process planner time (``plan.timings_s["total"]``, the plan-scale table's "planner s") of
the models given, fastest of REPEAT plans, for whichever sharderd this interpreter imports; the
10k-node stack (``L263``) also at 2 and 16 devices, as bench/plan_scale.py does. JSON on stdout.

    python bench/planner_time.py 3 bench/out/transformer_L26_h64_s32_v256.onnx ...
"""
import json, sys, time
from pathlib import Path
from sharderd.config import Config
from sharderd.engine import make_plan
from sharderd.graph.analyze import analyze
from sharderd.graph.load import load_model
config = Config(); target = config.target(None)
out = {}
for path in sys.argv[2:]:
    a = analyze(load_model(Path(path)), config.plan)
    for d in (8, 2, 16) if "L263" in path else (8,):
        best = None
        for _ in range(int(sys.argv[1])):
            p = make_plan(a, target, d, config.plan)
            t = p.timings_s["total"]
            best = t if best is None else min(best, t)
        out[f"{a.flow.num_nodes}x{d}"] = {"planner_s": best, "bottleneck_us": p.bottleneck_s * 1e6, "fewest_s": p.timings_s.get("fewest_devices"), "claim": p.claim[-90:]}
        print(a.flow.num_nodes, d, best, p.bottleneck_s * 1e6, p.timings_s.get("fewest_devices"), file=sys.stderr)
print(json.dumps(out))
