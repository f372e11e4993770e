"""Tensors the compiler computes once, at compile time: they occupy memory as weights, cost no time.

Once the inputs are static, an exporter's shape subgraphs (``Shape → Gather → Concat``) and any node
fed only by constants (``ConstantOfShape``, ``Expand`` or ``Tile`` of a small initializer, a
``Transpose`` of a weight) are folded into constants by PopART and onnxruntime alike. Costed as
activations they would be wrong twice: their bytes would show as traffic between stages, and the
memory of a large folded constant (the onnx package's ``light_resnet50`` makes 97.7 MiB of its
weights with ``ConstantOfShape``) would be counted only while "live". Here every folded tensor
becomes a weight of each node that reads it, and the folded nodes cost nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from sharderd.graph.costs import GraphCosts
from sharderd.graph.dataflow import Dataflow, csr
from sharderd.graph.propagate import TensorType

__all__ = ["Folding", "fold_constants"]

_NEVER_FOLDED = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "If",
        "Loop",
        "Scan",
        "SequenceConstruct",
        "SequenceEmpty",
    }
)
"""Nondeterministic ops are not constants; control flow is left to the compiler."""

_SHAPE_ONLY = frozenset({"Shape", "Size"})
"""Ops that read only their input's shape: constant whenever that shape is static."""


@dataclass(frozen=True, slots=True)
class Folding:
    flow: Dataflow
    costs: GraphCosts
    folded_nodes: int
    folded_bytes: int
    """Bytes of folded tensors now held as weights (each counted once)."""
    folded: np.ndarray
    """bool [N]: the folded nodes."""


def fold_constants(
    graph: onnx.GraphProto, flow: Dataflow, costs: GraphCosts, types: Mapping[str, TensorType]
) -> Folding:
    """Mark compile-time constants and re-home their bytes as weights of the nodes that read them."""
    foldable = _foldable_nodes(graph, flow, types)
    if not foldable.any():
        return Folding(flow, costs, 0, 0, foldable)
    folded_tensor = np.zeros(flow.num_tensors, dtype=bool)
    produced = flow.producer >= 0
    folded_tensor[produced] = foldable[flow.producer[produced]]
    folded_tensor &= ~flow.is_graph_output  # a constant output still goes to the host

    weight_names = list(flow.weight_names)
    weight_bytes = flow.weight_bytes.tolist()
    weight_types = flow.weight_types.tolist()
    new_weight: dict[int, int] = {}
    rows: list[list[int]] = []
    for node in range(flow.num_nodes):
        if foldable[node]:
            rows.append([])  # its inputs were folded into what it produces
            continue
        row = flow.weights(node).tolist()
        for t in flow.inputs(node):
            if not folded_tensor[t]:
                continue
            w = new_weight.get(int(t))
            if w is None:
                w = new_weight[int(t)] = len(weight_names)
                weight_names.append(f"folded:{flow.tensor_names[t]}")
                weight_bytes.append(int(costs.tensor_bytes[t]))
                tt = types.get(flow.tensor_names[t])
                weight_types.append(tt.elem_type if tt is not None else 0)
            row.append(w)
        rows.append(row)
    nw_ptr, nw_idx = csr(rows)
    new_flow = replace(
        flow,
        weight_names=tuple(weight_names),
        weight_bytes=np.asarray(weight_bytes, dtype=np.int64),
        weight_types=np.asarray(weight_types, dtype=np.int32),
        nw_ptr=nw_ptr,
        nw_idx=nw_idx,
    )
    tensor_bytes = costs.tensor_bytes.copy()
    tensor_bytes[folded_tensor] = 0
    flops = np.where(foldable, 0.0, costs.flops)
    folded_bytes = int(sum(weight_bytes[w] for w in new_weight.values()))
    return Folding(
        new_flow,
        replace(costs, flops=flops, tensor_bytes=tensor_bytes),
        int(foldable.sum()),
        folded_bytes,
        foldable,
    )


def _foldable_nodes(
    graph: onnx.GraphProto, flow: Dataflow, types: Mapping[str, TensorType]
) -> np.ndarray:
    foldable = np.zeros(flow.num_nodes, dtype=bool)
    nodes = graph.node
    for n in flow.topo_order.tolist():
        node = nodes[n]
        if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLDED:
            continue
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            continue
        inputs = flow.inputs(n)
        if node.op_type in _SHAPE_ONLY:
            tt = types.get(flow.tensor_names[inputs[0]]) if len(inputs) else None
            foldable[n] = tt is not None and tt.shape is not None
            continue
        foldable[n] = all(
            flow.producer[t] >= 0 and foldable[flow.producer[t]] for t in inputs.tolist()
        )
    return foldable
