"""Plan time and quality on branchy graphs: an Inception/DenseNet-shaped synthetic family and the
CNNs of tests/data/models, in process (load + analyze excluded from "plan s").

Each unit of the family is one Inception block (four parallel branches: 1x1; 1x1→3x3;
1x1→3x3→3x3; pool→1x1; concatenated and projected back) followed by a four-layer dense block
(every layer reads the concatenation of all earlier ones). Prints one Markdown row per model.

    python bench/plan_branchy.py                     # 1k, 10k, 50k nodes + corpus CNNs, 8 devices
    python bench/plan_branchy.py --sizes 1000 --devices 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parent.parent
CORPUS = ("tiny_efficientnet", "tiny_unet")
C, HW = 8, 8


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(0)
        self.k = 0

    def name(self, op: str) -> str:
        self.k += 1
        return f"{op}_{self.k}"

    def conv(self, x: str, cin: int, cout: int, kernel: int) -> str:
        w = self.name("W")
        self.inits.append(
            numpy_helper.from_array(
                (self.rng.standard_normal((cout, cin, kernel, kernel)) * 0.1).astype(np.float32), w
            )
        )
        out = self.name("conv")
        pad = kernel // 2
        self.nodes.append(helper.make_node("Conv", [x, w], [out], name=out, pads=[pad] * 4))
        relu = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [out], [relu], name=relu))
        return relu

    def op(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def inception(self, x: str) -> str:
        b1 = self.conv(x, C, C, 1)
        b2 = self.conv(self.conv(x, C, C, 1), C, C, 3)
        b3 = self.conv(self.conv(self.conv(x, C, C, 1), C, C, 3), C, C, 3)
        b4 = self.conv(self.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), C, C, 1)
        return self.conv(self.op("Concat", [b1, b2, b3, b4], axis=1), 4 * C, C, 1)

    def dense(self, x: str, layers: int = 4) -> str:
        feats = [x]
        for _ in range(layers):
            joined = feats[0] if len(feats) == 1 else self.op("Concat", feats, axis=1)
            feats.append(self.conv(self.conv(joined, C * len(feats), C, 1), C, C, 3))
        return self.conv(self.op("Concat", feats, axis=1), C * len(feats), C, 1)


def branchy(target_nodes: int) -> onnx.ModelProto:
    b = _Builder()
    x = "input"
    while len(b.nodes) < target_nodes:
        x = b.dense(b.inception(x))
    graph = helper.make_graph(
        b.nodes,
        "branchy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, C, HW, HW])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, C, HW, HW])],
        b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def measure(path: Path, devices: int) -> dict[str, object]:
    from sharderd.config import Config
    from sharderd.engine import make_plan
    from sharderd.graph.analyze import analyze
    from sharderd.graph.load import load_model

    config = Config()
    target = config.target(None)
    analysis = analyze(load_model(path), config.plan)
    t0 = time.perf_counter()
    try:
        plan = make_plan(analysis, target, devices, config.plan)
    except Exception as exc:  # a benchmark row, not a crash: say what happened
        return {
            "nodes": analysis.flow.num_nodes,
            "plan_s": time.perf_counter() - t0,
            "error": type(exc).__name__,
        }
    return {
        "nodes": analysis.flow.num_nodes,
        "plan_s": time.perf_counter() - t0,
        "method": getattr(plan, "method", "orders"),
        "proven_optimal": getattr(plan, "proven_optimal", None),
        "order": plan.order_name,
        "bottleneck_us": plan.bottleneck_s * 1e6,
        "bound_us": plan.lower_bound_s * 1e6,
        "claim": getattr(plan, "claim", ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--no-corpus", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    rows = []
    for size in args.sizes:
        path = OUT / f"branchy_{size}.onnx"
        if not path.exists():
            onnx.save(branchy(size), path)
        rows.append({"model": f"branchy {size}", **measure(path, args.devices)})
    if not args.no_corpus:
        for name in CORPUS:
            rows.append(
                {
                    "model": name,
                    **measure(ROOT / "tests/data/models" / name / "model.onnx", args.devices),
                }
            )
    print(
        "| model | nodes | devices | plan s | method | proven optimal | order | bottleneck µs | bound µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(
                f"| {r['model']} | {r['nodes']} | {args.devices} | {r['plan_s']:.3f} | {r['error']} | | | | |"
            )
            continue
        print(
            f"| {r['model']} | {r['nodes']} | {args.devices} | {r['plan_s']:.3f} | {r['method']} | {r['proven_optimal']} "
            f"| {r['order']} | {r['bottleneck_us']:.2f} | {r['bound_us']:.2f} |"
        )
    print()
    for r in rows:
        if r.get("claim"):
            print(f"- {r['model']} × {args.devices}: {r['claim']}")
    (OUT / "plan_branchy.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
