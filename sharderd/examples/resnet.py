"""``cnn``: a ResNet-like classifier with branchy residual blocks."""

from __future__ import annotations

import math

import numpy as np
import onnx

from sharderd.examples.builder import (
    Graph,
    float_info,
    graph_model,
    normal,
    positive,
)


def cnn(
    *,
    blocks: int = 4,
    channels: int = 32,
    image: int = 64,
    classes: int = 10,
    batch: int = 1,
    name_nodes: bool = True,
    seed: int = 0,
) -> onnx.ModelProto:
    """A ResNet-like classifier: branchy residual blocks, stride-2 projections, BatchNorm unfused.

    Every second block halves the image and doubles the channels (capped at 8x ``channels``, as in
    ResNet-18's 64 → 512), so deep variants stay a sensible size.
    """
    positive(blocks=blocks, channels=channels, image=image, classes=classes, batch=batch)
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)

    x = _conv_bn(g, rng, "/stem", "stem", "image", 3, channels, kernel=7, stride=2)
    x = g.op("Relu", "/stem/Relu", x)
    x = g.op("MaxPool", "/stem/MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    width = channels
    for i in range(blocks):
        downsample = i % 2 == 1
        out = min(2 * width, 8 * channels) if downsample else width
        x = _residual_block(g, rng, i, x, width, out, stride=2 if downsample else 1)
        width = out

    x = g.op("GlobalAveragePool", "/head/GlobalAveragePool", x)
    x = g.op("Flatten", "/head/Flatten", x, axis=1)
    weight = g.weight("fc.weight", normal(rng, classes, width, scale=1.0 / math.sqrt(width)))
    g.op(
        "Gemm",
        "/head/Gemm",
        x,
        weight,
        g.weight("fc.bias", normal(rng, classes)),
        transB=1,
        out="logits",
    )

    graph = g.to_graph(
        "cnn",
        [float_info("image", [batch, 3, image, image])],
        [float_info("logits", [batch, classes])],
    )
    return graph_model(graph, f"ResNet-like CNN: {blocks} blocks, {channels} channels, {image}px")


def _conv_bn(
    g: Graph,
    rng: np.random.Generator,
    node: str,
    param: str,
    x: str,
    cin: int,
    cout: int,
    *,
    kernel: int,
    stride: int,
) -> str:
    fan_in = cin * kernel * kernel
    weight = g.weight(
        f"{param}.conv.weight",
        normal(rng, cout, cin, kernel, kernel, scale=math.sqrt(2.0 / fan_in)),
    )
    pad = kernel // 2
    x = g.op(
        "Conv",
        f"{node}/Conv",
        x,
        weight,
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad] * 4,
    )
    stats = {
        "weight": 1.0 + normal(rng, cout, scale=0.1),
        "bias": normal(rng, cout, scale=0.1),
        "running_mean": normal(rng, cout, scale=0.1),
        "running_var": 1.0 + np.abs(normal(rng, cout, scale=0.1)),
    }
    names = [g.weight(f"{param}.bn.{k}", v) for k, v in stats.items()]
    return g.op("BatchNormalization", f"{node}/BatchNormalization", x, *names, epsilon=1e-5)


def _residual_block(
    g: Graph, rng: np.random.Generator, i: int, x: str, cin: int, cout: int, *, stride: int
) -> str:
    node, param = f"/block{i}", f"layer.{i}"
    y = _conv_bn(g, rng, f"{node}/conv1", f"{param}.conv1", x, cin, cout, kernel=3, stride=stride)
    y = g.op("Relu", f"{node}/conv1/Relu", y)
    y = _conv_bn(g, rng, f"{node}/conv2", f"{param}.conv2", y, cout, cout, kernel=3, stride=1)
    skip = x
    if stride != 1 or cin != cout:
        skip = _conv_bn(
            g,
            rng,
            f"{node}/downsample",
            f"{param}.downsample",
            x,
            cin,
            cout,
            kernel=1,
            stride=stride,
        )
    y = g.op("Add", f"{node}/Add", y, skip)
    return g.op("Relu", f"{node}/Relu", y)
