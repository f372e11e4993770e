"""One node of the model as a standalone model: what a probe compiles on one device.

Its activation inputs become graph inputs (fed from the host, as a stage's received tensors are),
at the static shapes the plan costs; its initializers come along with their bytes (one op's
weights, read from the external file if they live there); ``Constant`` producers come along too,
so shape and axis operands stay constants for the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnx

from sharderd.graph.analyze import Analysis
from sharderd.graph.weights import with_inlined
from sharderd.shard.matmul_serial import set_serialization
from sharderd.shard.split import standalone_model
from sharderd.shard.write import write_converted

__all__ = ["node_model", "write_node_model"]


def node_model(analysis: Analysis, node: int) -> onnx.ModelProto:
    """Node ``node`` (file index) alone, weights inlined."""
    model = analysis.model
    graph = model.graph
    target = graph.node[node]
    producers = {out: n for n in graph.node for out in n.output if n.op_type == "Constant"}
    dense = {t.name: k for k, t in enumerate(graph.initializer)}
    sparse = {t.values.name: k for k, t in enumerate(graph.sparse_initializer)}
    nodes, weights, inputs = [], [], []
    for name in dict.fromkeys(i for i in target.input if i):
        if name in dense:
            weights.append(dense[name])
        elif name in sparse:
            weights.append(len(graph.initializer) + sparse[name])
        elif name in producers:
            nodes.append(producers[name])
        else:
            inputs.append(_value(analysis, name))
    nodes.append(target)
    outputs = [_value(analysis, name) for name in target.output if name]
    alone = standalone_model(
        model,
        nodes,
        sorted(weights),
        inputs,
        outputs,
        doc=f"node {target.name!r} alone, as a sharderd probe compiles it",
        name=f"probe_{target.name or node}",
    )
    return with_inlined(alone, analysis.loaded.path.parent)


def write_node_model(
    analysis: Analysis, node: int, path: Path, serialization: Mapping[str, int] | None = None
) -> Path:
    """Write node ``node`` alone, with PopART's matmul serialization if ``serialization`` names it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model = node_model(analysis, node)
    set_serialization(model, serialization or {})
    write_converted(model, path)
    return path


def _value(analysis: Analysis, name: str) -> onnx.ValueInfoProto:
    """The tensor at the shape the plan costs (the file's own declaration when none is known)."""
    known = analysis.shapes.types.get(name)
    if known is not None and known.shape is not None:
        return onnx.helper.make_tensor_value_info(name, known.elem_type, list(known.shape))
    graph = analysis.model.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.name == name:
            return value
    elem = known.elem_type if known is not None else onnx.TensorProto.FLOAT
    return onnx.helper.make_tensor_value_info(name, elem, None)
