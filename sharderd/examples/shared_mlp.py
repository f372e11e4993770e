"""``shared_weights``: one initializer read by distant nodes."""

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
    require,
)


def shared_weights(
    *, layers: int = 6, hidden: int = 128, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """An MLP whose first, middle and last MatMuls read the same initializer ``W_shared``.

    A sharder must place that weight on every stage that uses it and count its bytes once per device,
    not once per node.
    """
    positive(layers=layers, hidden=hidden, batch=batch)
    require(layers >= 3, "layers", f"must be >= 3 so first, middle and last differ, got {layers}")
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)
    shared = g.weight("W_shared", normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden)))
    uses_shared = {0, layers // 2, layers - 1}
    x = "x"
    for i in range(layers):
        node = f"/layer{i}"
        if i in uses_shared:
            weight = shared
        else:
            weight = g.weight(
                f"layer{i}.weight", normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden))
            )
        x = g.op("MatMul", f"{node}/MatMul", x, weight)
        last = i == layers - 1
        bias = g.weight(f"layer{i}.bias", normal(rng, hidden))
        x = g.op("Add", f"{node}/Add", x, bias, out="y" if last else None)
        if not last:
            x = g.op("Relu", f"{node}/Relu", x)
    graph = g.to_graph(
        "shared_weights", [float_info("x", [batch, hidden])], [float_info("y", [batch, hidden])]
    )
    return graph_model(
        graph, f"MLP of {layers} layers sharing W_shared in layers {sorted(uses_shared)}"
    )
