"""Plan time and quality on the real DenseNet-121 and Inception-v3 architectures (issue 11).

torchvision is not installable here, so both are built with ``onnx.helper`` layer for layer as
torchvision defines them and as ``torch.onnx.export`` writes them in eval mode: Inception-v3's
conv+BN pairs folded into one Conv (+Relu), DenseNet-121's pre-activation BatchNormalization
kept as its own node, every dense layer reading the Concat of all earlier features, real channel
counts, kernels (1x7, 7x1, 1x3, 3x1), strides and pads, at 224x224 (DenseNet) and 299x299
(Inception), batch 1, random weights. Rows as in bench/plan_branchy.py (in process, "plan s"
excludes load and analysis).

    python bench/plan_cnns.py                     # both models, 4 and 8 devices
    PYTHONPATH=<worktree of another commit> python bench/plan_cnns.py   # the same on that commit
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from plan_branchy import measure  # bench/ is not a package: python puts this folder on sys.path

OUT = Path(__file__).resolve().parent / "out"


class _Net:
    """Appends nodes and random initializers; tracks channels so callers state only the layer."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(0)
        self.k = 0

    def _name(self, op: str) -> str:
        self.k += 1
        return f"{op}_{self.k}"

    def _param(self, shape: tuple[int, ...]) -> str:
        name = self._name("w")
        data = (self.rng.standard_normal(shape) * 0.05).astype(np.float32)
        self.inits.append(numpy_helper.from_array(data, name))
        return name

    def op(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: tuple[int, int],
        stride: int = 1,
        pad: tuple[int, int] = (0, 0),
        relu: bool = True,
    ) -> str:
        w, b = self._param((cout, cin, *k)), self._param((cout,))
        y = self.op(
            "Conv",
            [x, w, b],
            kernel_shape=list(k),
            strides=[stride, stride],
            pads=[pad[0], pad[1], pad[0], pad[1]],
        )
        return self.op("Relu", [y]) if relu else y

    def bn_relu(self, x: str, c: int) -> str:
        scale, bias, mean = self._param((c,)), self._param((c,)), self._param((c,))
        var = self._name("var")
        self.inits.append(numpy_helper.from_array(np.ones(c, np.float32), var))
        return self.op("Relu", [self.op("BatchNormalization", [x, scale, bias, mean, var])])

    def pool(self, op: str, x: str, k: int, stride: int, pad: int = 0) -> str:
        return self.op(op, [x], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def concat(self, xs: list[str]) -> str:
        return self.op("Concat", xs, axis=1)

    def head(self, x: str, c: int) -> str:
        flat = self.op("Flatten", [self.op("GlobalAveragePool", [x])])
        return self.op("Gemm", [flat, self._param((1000, c)), self._param((1000,))], transB=1)

    def model(self, name: str, hw: int, out: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 1000])],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def densenet121() -> onnx.ModelProto:
    n, growth = _Net(), 32
    x = n.pool("MaxPool", n.conv("input", 3, 64, (7, 7), 2, (3, 3)), 3, 2, 1)
    c = 64
    for i, layers in enumerate((6, 12, 24, 16)):
        feats = [x]
        for _ in range(layers):
            joined = feats[0] if len(feats) == 1 else n.concat(feats)
            cin = c + growth * (len(feats) - 1)
            mid = n.conv(n.bn_relu(joined, cin), cin, 4 * growth, (1, 1), relu=False)
            feats.append(
                n.conv(
                    n.bn_relu(mid, 4 * growth), 4 * growth, growth, (3, 3), 1, (1, 1), relu=False
                )
            )
        x, c = n.concat(feats), c + growth * layers
        if i < 3:  # transition: halve channels and size
            x = n.pool("AveragePool", n.conv(n.bn_relu(x, c), c, c // 2, (1, 1), relu=False), 2, 2)
            c //= 2
    return n.model("densenet121", 224, n.head(n.bn_relu(x, c), c))


def inception_v3() -> onnx.ModelProto:
    n = _Net()
    x = n.conv("input", 3, 32, (3, 3), 2)
    x = n.conv(n.conv(x, 32, 32, (3, 3)), 32, 64, (3, 3), 1, (1, 1))
    x = n.conv(n.pool("MaxPool", x, 3, 2), 64, 80, (1, 1))
    x = n.pool("MaxPool", n.conv(x, 80, 192, (3, 3)), 3, 2)
    c = 192
    for pool_features in (32, 64, 64):  # InceptionA: Mixed_5b..5d
        b1 = n.conv(x, c, 64, (1, 1))
        b5 = n.conv(n.conv(x, c, 48, (1, 1)), 48, 64, (5, 5), 1, (2, 2))
        b3 = n.conv(
            n.conv(n.conv(x, c, 64, (1, 1)), 64, 96, (3, 3), 1, (1, 1)), 96, 96, (3, 3), 1, (1, 1)
        )
        bp = n.conv(n.pool("AveragePool", x, 3, 1, 1), c, pool_features, (1, 1))
        x, c = n.concat([b1, b5, b3, bp]), 224 + pool_features
    b3 = n.conv(x, c, 384, (3, 3), 2)  # InceptionB: Mixed_6a
    bd = n.conv(n.conv(n.conv(x, c, 64, (1, 1)), 64, 96, (3, 3), 1, (1, 1)), 96, 96, (3, 3), 2)
    x, c = n.concat([b3, bd, n.pool("MaxPool", x, 3, 2)]), 384 + 96 + c
    for c7 in (128, 160, 160, 192):  # InceptionC: Mixed_6b..6e
        b1 = n.conv(x, c, 192, (1, 1))
        b7 = n.conv(
            n.conv(n.conv(x, c, c7, (1, 1)), c7, c7, (1, 7), 1, (0, 3)), c7, 192, (7, 1), 1, (3, 0)
        )
        bd = n.conv(x, c, c7, (1, 1))
        for k, pad, cout in (
            ((7, 1), (3, 0), c7),
            ((1, 7), (0, 3), c7),
            ((7, 1), (3, 0), c7),
            ((1, 7), (0, 3), 192),
        ):
            bd = n.conv(bd, c7, cout, k, 1, pad)
        bp = n.conv(n.pool("AveragePool", x, 3, 1, 1), c, 192, (1, 1))
        x, c = n.concat([b1, b7, bd, bp]), 768
    b3 = n.conv(n.conv(x, c, 192, (1, 1)), 192, 320, (3, 3), 2)  # InceptionD: Mixed_7a
    b7 = n.conv(
        n.conv(n.conv(x, c, 192, (1, 1)), 192, 192, (1, 7), 1, (0, 3)), 192, 192, (7, 1), 1, (3, 0)
    )
    x, c = (
        n.concat([b3, n.conv(b7, 192, 192, (3, 3), 2), n.pool("MaxPool", x, 3, 2)]),
        320 + 192 + c,
    )
    for _ in range(2):  # InceptionE: Mixed_7b, 7c
        b1 = n.conv(x, c, 320, (1, 1))
        s = n.conv(x, c, 384, (1, 1))
        b3 = n.concat(
            [n.conv(s, 384, 384, (1, 3), 1, (0, 1)), n.conv(s, 384, 384, (3, 1), 1, (1, 0))]
        )
        d = n.conv(n.conv(x, c, 448, (1, 1)), 448, 384, (3, 3), 1, (1, 1))
        bd = n.concat(
            [n.conv(d, 384, 384, (1, 3), 1, (0, 1)), n.conv(d, 384, 384, (3, 1), 1, (1, 0))]
        )
        bp = n.conv(n.pool("AveragePool", x, 3, 1, 1), c, 192, (1, 1))
        x, c = n.concat([b1, b3, bd, bp]), 2048
    return n.model("inception_v3", 299, n.head(x, c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    rows = []
    for name, build in (("densenet121", densenet121), ("inception_v3", inception_v3)):
        path = OUT / f"{name}.onnx"
        if not path.exists():
            onnx.save(build(), path)
        for devices in args.devices:
            rows.append({"model": name, "devices": devices, **measure(path, devices)})
    print("| model | nodes | devices | plan s | method | order | bottleneck µs | bound µs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(
                f"| {r['model']} | {r['nodes']} | {r['devices']} | {r['plan_s']:.3f} | {r['error']} | | | |"
            )
            continue
        print(
            f"| {r['model']} | {r['nodes']} | {r['devices']} | {r['plan_s']:.3f} | {r['method']} "
            f"| {r['order']} | {r['bottleneck_us']:.2f} | {r['bound_us']:.2f} |"
        )
    print()
    for r in rows:
        if r.get("claim"):
            print(f"- {r['model']} × {r['devices']}: {r['claim']}")
    (OUT / "plan_cnns.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
