"""In-process planner time (``plan.timings_s["total"]``, the plan-scale table's "planner s") of
the models given, fastest of REPEAT plans, for whichever sharderd this interpreter imports; the
10k-node stack (``L263``) also at 2 and 16 devices, as bench/plan_scale.py does. JSON on stdout.

    python bench/planner_time.py 3 bench/out/transformer_L26_h64_s32_v256.onnx ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from sharderd.config import Config
    from sharderd.engine import make_plan
    from sharderd.graph.analyze import analyze
    from sharderd.graph.load import load_model

    config = Config()
    target = config.target(None)
    repeat = int(sys.argv[1])
    out = {}
    for path in sys.argv[2:]:
        analysis = analyze(load_model(Path(path)), config.plan)
        for devices in (8, 2, 16) if "L263" in path else (8,):
            times = []
            for _ in range(repeat):
                plan = make_plan(analysis, target, devices, config.plan)
                times.append(plan.timings_s["total"])
            key = f"{analysis.flow.num_nodes}x{devices}"
            out[key] = {
                "planner_s": min(times),
                "bottleneck_us": plan.bottleneck_s * 1e6,
                "fewest_s": plan.timings_s.get("fewest_devices"),
            }
            print(key, out[key], file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
