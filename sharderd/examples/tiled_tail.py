"""``tiled_tail``: weights up front, activations at the tail, so one stage needs its temporaries."""

from __future__ import annotations

import numpy as np
import onnx

from sharderd.examples.builder import Graph, float_info, graph_model, ints, positive, require


def tiled_tail(
    *, hidden: int = 1024, rows: int = 1024, out: int = 256, name_nodes: bool = True
) -> onnx.ModelProto:
    """x[16, hidden] → 2 × (MatMul hidden×hidden, Relu) → Tile to ``rows`` rows → MatMul hidden×out
    → Relu.

    The first MatMuls hold most of the weights on few activations; the last one multiplies a large
    activation by a small weight, so its planner temporaries, not its weights, fill a device. On two
    devices only the tail's device runs short, which is what a per-stage available memory proportion
    is for. ``rows`` must be a multiple of 16; weights are constant (0.01), so outputs stay finite.
    """
    positive(hidden=hidden, rows=rows, out=out)
    require(rows % 16 == 0, "rows", f"must be a multiple of 16, got {rows}")
    g = Graph(name_nodes=name_nodes)
    x = "x"
    for k in (1, 2):
        weight = g.weight(f"wa{k}", np.full((hidden, hidden), 0.01, np.float32))
        x = g.op("Relu", f"Relu_a{k}", g.op("MatMul", f"MatMul_a{k}", x, weight))
    tiled = g.op("Tile", "Tile_b", x, g.weight("reps", ints(rows // 16, 1)))
    last = g.op(
        "MatMul", "MatMul_b", tiled, g.weight("wb", np.full((hidden, out), 0.01, np.float32))
    )
    g.op("Relu", "Relu_b", last, out="y")
    graph = g.to_graph(
        "tiled_tail", [float_info("x", [16, hidden])], [float_info("y", [rows, out])]
    )
    return graph_model(graph, "two MatMuls, then a Tile to many rows and a small MatMul")
