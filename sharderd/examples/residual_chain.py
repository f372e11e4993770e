"""``chain``: exactly N nodes in linear time, for planner benchmarks up to 100k nodes."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from sharderd.examples.builder import (
    empty_model,
    float_info,
    normal,
    positive,
)


def chain(
    *, nodes: int = 100, hidden: int = 64, batch: int = 1, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """Exactly ``nodes`` nodes: units of MatMul, Relu, MatMul, Relu, Add(unit input), repeated.

    Built for planner benchmarks at 1k-100k nodes in linear time and one copy of the weights: the
    protos are filled in place, and every MatMul has its own initializer whose bytes come from a few
    arrays drawn once. Weights total about ``0.4 · nodes · hidden² · 4`` bytes, so pick a small
    ``hidden`` for 100k nodes. Their scale shrinks as ``1/sqrt(units)`` (as in Fixup), so the residual
    sum stays O(1) at any depth and outputs are finite and differ from the input.
    """
    positive(nodes=nodes, hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    units = -(-nodes // 5)
    scale = min(0.5, 1.0 / math.sqrt(units)) / math.sqrt(hidden)
    pool = [normal(rng, hidden, hidden, scale=scale).tobytes() for _ in range(4)]
    model = empty_model(f"MatMul/Relu chain of {nodes} nodes with residual Adds")
    graph = model.graph
    graph.name = "chain"
    graph.input.append(float_info("x", [batch, hidden]))
    graph.output.append(float_info("y", [batch, hidden]))
    x = unit_input = "x"
    for k in range(nodes):
        unit, step = divmod(k, 5)
        op_type = _CHAIN_UNIT[step]
        name = f"/unit{unit}/{op_type}_{step // 2}" if step < 4 else f"/unit{unit}/Add"
        if step == 0:
            unit_input = x
        if op_type == "MatMul":
            weight = f"unit{unit}.{step // 2}.weight"
            graph.initializer.add(
                name=weight,
                dims=[hidden, hidden],
                data_type=TensorProto.FLOAT,
                raw_data=pool[k % 4],
            )
            inputs = [x, weight]
        else:
            inputs = [x, unit_input] if op_type == "Add" else [x]
        out = "y" if k == nodes - 1 else f"{name}_output_0"
        graph.node.add(op_type=op_type, name=name if name_nodes else "", input=inputs, output=[out])
        x = out
    return model


_CHAIN_UNIT = ("MatMul", "Relu", "MatMul", "Relu", "Add")
