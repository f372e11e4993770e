"""FLOPs of the recurrent ops (LSTM, GRU, RNN): one formula, parameterised by the gate count."""

from __future__ import annotations

import onnx

from sharderd.graph.flops.operands import Rule, Shapes, has_input, int_attr, shape_at, str_attr
from sharderd.graph.flops.unit_costs import ARITH, TRANSCENDENTAL


def recurrent(gates: int, transcendental: int, arith: int) -> Rule:
    """Per time step and direction: [x, h] × all gate weights, then the gate math per hidden unit."""

    def rule(node: onnx.NodeProto, ins: Shapes, outs: Shapes) -> float | None:
        x, w, r = shape_at(ins, 0), shape_at(ins, 1), shape_at(ins, 2)
        if x is None or len(x) != 3:
            return None
        seq, batch = (x[1], x[0]) if int_attr(node, "layout", 0) else (x[0], x[1])
        hidden = int_attr(node, "hidden_size", 0) or (r[2] if r is not None and len(r) == 3 else 0)
        if not hidden:
            return None
        inp = w[2] if w is not None and len(w) == 3 else x[2]
        dirs = 2 if str_attr(node, "direction", "forward") == "bidirectional" else 1
        bias = 2 * gates * ARITH if has_input(node, 3) else 0.0
        per_unit = 2.0 * gates * (inp + hidden) + transcendental * TRANSCENDENTAL + arith * ARITH
        return float(seq * dirs * batch * hidden) * (per_unit + bias)

    return rule
