"""A rewrite into pieces priced in the cost model, without writing it.

``priced`` returns the analysis of the model as ``serialize_node`` would write it, spliced from the
analysis of the model as it is: the node gives way to the rewrite's nodes (``serialize.rewrite_of``,
the same structure ``serialize_node`` writes), each piece with its slice of the weight, the joining
``Concat``/``Sum``, every new tensor sized by ONNX's inference of its node, and the input now read by
every piece (so a cut between pieces pays its copy, like any other). Only the rewrite's own nodes
are costed; every array of the rest is shifted, not recomputed, so pricing costs milliseconds on a
10k-node graph. tests/shard/test_serialize_price.py checks the priced analysis against the analysis
of the written rewrite: the same graph, costs, folding, aliases and plan.

The priced analysis names no weight bytes: its model holds the initializers' shapes only, and
``engine.annotated_model`` refuses it. ``shard`` writes a rewrite it keeps with ``serialize_node``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto
from onnx.helper import make_tensor_type_proto

from sharderd.graph.analyze import Analysis
from sharderd.graph.buffers import alias_sources
from sharderd.graph.costs import GraphCosts, node_flops_of
from sharderd.graph.dataflow import Dataflow, topological_order
from sharderd.graph.fixed_point import node_output_types
from sharderd.graph.propagate import TensorType, model_shell
from sharderd.graph.tensors import shape_bytes
from sharderd.shard.serialize import Rewrite, Serialized, rewrite_of

__all__ = ["priced"]

_PRICED_LOCATION = "__sharderd_priced__"
"""The external-data location every initializer of a priced model names: no file has it."""


def priced(
    analysis: Analysis, chosen: Sequence[tuple[str, int]]
) -> tuple[Analysis, tuple[Serialized, ...]]:
    """``analysis`` with each ``(node, pieces)`` rewritten in turn, and what each rewrite did."""
    if not chosen:
        return analysis, ()
    model = _shapes_only(analysis.model)
    records = []
    for name, pieces in chosen:
        node = next(n for n in model.graph.node if n.name == name)
        index = analysis.shapes.types.get(node.input[1]) if node.op_type == "Gather" else None
        index_type = index.elem_type if index is not None and index.elem_type else None
        rewrite = rewrite_of(model, name, pieces, index_type=index_type or TensorProto.INT64)
        analysis = _splice(analysis, model, rewrite)
        records.append(rewrite.record)
    return analysis, tuple(records)


def _shapes_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers carry dims and type, no values."""
    copy = model_shell(model)
    source, graph = model.graph, copy.graph
    graph.node.extend(source.node)
    for tensor in source.initializer:
        graph.initializer.append(_stub(tensor.name, tuple(tensor.dims), tensor.data_type))
    return copy


def _stub(name: str, shape: tuple[int, ...], data_type: int) -> TensorProto:
    stub = TensorProto(name=name, dims=list(shape), data_type=data_type)
    stub.data_location = TensorProto.EXTERNAL
    stub.external_data.add(key="location", value=_PRICED_LOCATION)
    return stub


def _splice(analysis: Analysis, model: onnx.ModelProto, rewrite: Rewrite) -> Analysis:
    """``analysis`` after ``rewrite``, which ``model`` (the priced copy) takes on in place."""
    flow, p, nodes = analysis.flow, rewrite.position, list(rewrite.nodes)
    if analysis.folded is not None and analysis.folded[p]:
        raise ValueError(f"node {flow.node_names[p]!r} is folded into a constant: nothing to price")
    rewrite_node = onnx.NodeProto()
    rewrite_node.CopyFrom(model.graph.node[p])
    output = rewrite_node.output[0]
    types = _new_types(analysis, model, rewrite)
    new_tensors = [o for n in nodes for o in n.output if o and o != output]
    weights = _new_weights(analysis, rewrite)

    graph = model.graph
    graph.initializer.extend(_stub(w.name, w.shape, w.data_type) for w in rewrite.weights)
    if rewrite.dropped is not None:
        graph.initializer.remove(next(t for t in graph.initializer if t.name == rewrite.dropped))
    del graph.node[p]
    for offset, node in enumerate(nodes):
        graph.node.insert(p + offset, node)

    new_flow, shift = _spliced_flow(flow, p, nodes, new_tensors, output, weights)
    flops, defaults = node_flops_of(nodes, types)
    _, replaced = node_flops_of([rewrite_node], analysis.shapes.types)
    costs = analysis.costs
    default_ops = dict(costs.default_cost_ops)
    for op, count in defaults.items():
        default_ops[op] = default_ops.get(op, 0) + count
    for op, count in replaced.items():
        default_ops[op] -= count
        if not default_ops[op]:
            del default_ops[op]
    sized = {t: types.get(t) or TensorType(0, None) for t in new_tensors}
    new_bytes = [_at_precision(analysis, sized[t]) for t in new_tensors]
    unknown = {*costs.unknown_tensors, *(t for t in new_tensors if sized[t].shape is None)}
    ty = shift.tensor_at
    tensor_bytes = np.insert(costs.tensor_bytes, ty, np.asarray(new_bytes, dtype=np.int64))
    new_costs = GraphCosts(
        np.concatenate([costs.flops[:p], flops, costs.flops[p + 1 :]]),
        tensor_bytes,
        tuple(t for t in new_flow.tensor_names if t in unknown),
        default_ops,
        costs.control_flow_notes,
    )
    folded = None
    if analysis.folded is not None:
        folded = np.concatenate(
            [analysis.folded[:p], np.zeros(len(nodes), dtype=bool), analysis.folded[p + 1 :]]
        )
    compiled = np.ones(new_flow.num_nodes, dtype=bool) if folded is None else ~folded
    return replace(
        analysis,
        loaded=replace(analysis.loaded, model=model),
        flow=new_flow,
        costs=new_costs,
        shapes=replace(analysis.shapes, types=types),
        folded=folded,
        alias_source=alias_sources(graph, new_flow, tensor_bytes, compiled),
        priced=True,
    )


def _new_types(
    analysis: Analysis, model: onnx.ModelProto, rewrite: Rewrite
) -> dict[str, TensorType]:
    """Every tensor's type after the rewrite: the new ones from ONNX's inference of each new node
    (of unknown size where an input's size is unknown, as inference of the written model leaves
    them)."""
    types = dict(analysis.shapes.types)
    for w in rewrite.weights:
        types[w.name] = TensorType(w.data_type, w.shape)
    values = {w.name: onnx.helper.make_tensor(w.name, w.data_type, [], [w.value])
              for w in rewrite.weights if w.kind == "scalar"}  # fmt: skip
    versions = {o.domain or "": o.version for o in model.opset_import}
    for node in rewrite.nodes:
        given = {}
        for name in node.input:
            tt = types.get(name) or TensorType(0, None)
            given[name] = make_tensor_type_proto(tt.elem_type, tt.shape)
        schema = onnx.defs.get_schema(node.op_type, versions.get(node.domain, 0), node.domain)
        data = {k: v for k, v in values.items() if k in given}
        found = node_output_types(schema, node, given, data, model.opset_import)
        for out, tt in found.items():
            if tt.elem_type or tt.shape is not None:  # else nothing is known of it, as before
                types[out] = tt
    return types


def _at_precision(analysis: Analysis, tt: TensorType) -> int:
    """A new tensor's bytes at the planned precision (graph/precision.py: never an input/output)."""
    if tt.shape is None:
        return 0  # unknown size: 0 bytes, listed as unknown (graph/costs.py)
    raw = shape_bytes(tt.shape, tt.elem_type)
    return raw // 2 if analysis.precision == "fp16" and tt.elem_type == TensorProto.FLOAT else raw


def _new_weights(analysis: Analysis, rewrite: Rewrite) -> list[tuple[str, int, int]]:
    """(name, bytes, type) of each initializer the rewrite adds, at the planned precision."""
    half = analysis.precision == "fp16"
    found: list[tuple[str, int, int]] = []
    for w in rewrite.weights:
        raw = shape_bytes(w.shape, w.data_type)
        if half and w.data_type == TensorProto.FLOAT:
            found.append((w.name, raw // 2, int(TensorProto.FLOAT16)))
        else:
            found.append((w.name, raw, w.data_type))
    return found


class _Shift:
    """Where old indices go: nodes after ``p`` move by ``grow`` (the rewrite's nodes less one),
    tensors from ``tensor_at`` (the rewritten node's output) by ``added`` (its new tensors)."""

    def __init__(self, p: int, grow: int, tensor_at: int, added: int) -> None:
        self.p, self.grow, self.tensor_at, self.added = p, grow, tensor_at, added

    def node(self, ids: np.ndarray) -> np.ndarray:
        return np.where(ids > self.p, ids + self.grow, ids)

    def tensor(self, ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= self.tensor_at, ids + self.added, ids)


def _spliced_flow(
    flow: Dataflow,
    p: int,
    nodes: list[onnx.NodeProto],
    new_tensors: list[str],
    output: str,
    weights: list[tuple[str, int, int]],
) -> tuple[Dataflow, _Shift]:
    tensor_id = {name: t for t, name in enumerate(flow.tensor_names)}
    ty = tensor_id[output]
    shift = _Shift(p, len(nodes) - 1, ty, len(new_tensors))
    new_id = {name: ty + k for k, name in enumerate(new_tensors)} | {output: ty + len(new_tensors)}
    weight_id: dict[str, int] = {}
    for w, name in enumerate(flow.weight_names):
        weight_id.setdefault(name, w)
    first_new = len(flow.weight_names)
    weight_id |= {name: first_new + k for k, (name, _, _) in enumerate(weights)}

    ins, outs, reads = [], [], []
    for node in nodes:
        acts: dict[int, None] = {}
        uses: dict[int, None] = {}
        for name in (n for n in node.input if n):
            if name in new_id:
                acts.setdefault(new_id[name], None)
            elif name in tensor_id:
                acts.setdefault(int(shift.tensor(np.array(tensor_id[name]))), None)
            else:
                uses.setdefault(weight_id[name], None)
        ins.append(list(acts))
        reads.append(list(uses))
        outs.append([new_id[o] for o in node.output if o])

    in_ptr, in_idx = _csr_splice(flow.in_ptr, flow.in_idx, p, ins, shift.tensor)
    out_ptr, out_idx = _csr_splice(flow.out_ptr, flow.out_idx, p, outs, shift.tensor)
    nw_ptr, nw_idx = _csr_splice(flow.nw_ptr, flow.nw_idx, p, reads, lambda w: w)

    producer = flow.producer
    made = np.repeat(np.arange(p, p + len(nodes)), [len(o) for o in outs])
    before, after = producer[:ty], producer[ty + 1 :]
    producer = np.concatenate([before, made, shift.node(after)]).astype(np.int64)
    num_tensors = len(producer)

    counts = np.diff(flow.cons_ptr)
    tensor_of = np.repeat(np.arange(flow.num_tensors), counts)
    keep = flow.cons_idx != p
    pairs_t = [shift.tensor(tensor_of[keep]), [t for row in ins for t in row]]
    pairs_n = [shift.node(flow.cons_idx[keep]), [p + i for i, row in enumerate(ins) for _ in row]]
    cons_t = np.concatenate([np.asarray(x, dtype=np.int64) for x in pairs_t])
    cons_n = np.concatenate([np.asarray(x, dtype=np.int64) for x in pairs_n])
    order = np.lexsort((cons_n, cons_t))
    cons_ptr = np.zeros(num_tensors + 1, dtype=np.int64)
    np.cumsum(np.bincount(cons_t, minlength=num_tensors), out=cons_ptr[1:])

    names = flow.tensor_names
    num_nodes = flow.num_nodes + len(nodes) - 1
    new_flow = replace(
        flow,
        node_names=(*flow.node_names[:p], *(n.name for n in nodes), *flow.node_names[p + 1 :]),
        op_types=(*flow.op_types[:p], *(n.op_type for n in nodes), *flow.op_types[p + 1 :]),
        tensor_names=(*names[:ty], *new_tensors, *names[ty:]),
        producer=producer,
        cons_ptr=cons_ptr,
        cons_idx=cons_n[order],
        in_ptr=in_ptr,
        in_idx=in_idx,
        out_ptr=out_ptr,
        out_idx=out_idx,
        is_graph_output=np.insert(flow.is_graph_output, ty, np.zeros(len(new_tensors), bool)),
        weight_names=(*flow.weight_names, *(w[0] for w in weights)),
        weight_bytes=np.concatenate([flow.weight_bytes, [w[1] for w in weights]]).astype(np.int64),
        weight_types=np.concatenate([flow.weight_types, [w[2] for w in weights]]).astype(np.int32),
        nw_ptr=nw_ptr,
        nw_idx=nw_idx,
        topo_order=np.arange(num_nodes, dtype=np.int64),
    )
    if not np.array_equal(flow.topo_order, np.arange(flow.num_nodes)):
        new_flow = replace(new_flow, topo_order=_kahn(new_flow))
    return new_flow, shift


def _csr_splice(
    ptr: np.ndarray,
    idx: np.ndarray,
    p: int,
    rows: list[list[int]],
    move: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Row ``p`` of a CSR replaced by ``rows``; every index in the other rows moved by ``move``."""
    lengths = np.concatenate([np.diff(ptr[: p + 1]), [len(r) for r in rows], np.diff(ptr[p + 1 :])])
    new_ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_ptr[1:])
    flat = np.asarray([x for r in rows for x in r], dtype=np.int64)
    new_idx = np.concatenate([move(idx[: ptr[p]]), flat, move(idx[ptr[p + 1] :])])
    return new_ptr, new_idx.astype(np.int64)


def _kahn(flow: Dataflow) -> np.ndarray:
    """The topological order ``build_dataflow`` gives a file that is not in one already."""
    n = flow.num_nodes
    in_rows = [flow.inputs(q).tolist() for q in range(n)]
    out_rows = [flow.outputs(q).tolist() for q in range(n)]
    cons_rows = [flow.consumers(t).tolist() for t in range(flow.num_tensors)]
    return np.asarray(topological_order(n, in_rows, flow.producer, cons_rows, out_rows), np.int64)
