"""The model's dataflow as flat arrays: who produces and who consumes every tensor.

Built in one pass over nodes and edges (O(N + E)), with name lookups in dicts, never by comparing
nodes pairwise. Control-flow bodies (If/Loop/Scan) are folded into their node: tensors a body reads
from the outer scope become inputs of that node, weights inside a body belong to that node.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import onnx

from sharderd.errors import ModelInvalidError
from sharderd.graph.tensors import tensor_nbytes

__all__ = ["Dataflow", "body_outer_references", "build_dataflow", "csr", "topological_order"]

_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


@dataclass(frozen=True, slots=True)
class Dataflow:
    """Top-level nodes, activation tensors and weights, indexed by position.

    Activation tensors are graph inputs (``producer == -1``) and node outputs. Weights are
    initializers (shared ones have one id, so a stage counts them once) plus tensors held by
    ``Constant`` nodes and inside control-flow bodies.
    """

    node_names: tuple[str, ...]
    op_types: tuple[str, ...]
    tensor_names: tuple[str, ...]
    producer: np.ndarray
    """int64 [T]: producing node, -1 for a graph input."""
    cons_ptr: np.ndarray
    cons_idx: np.ndarray
    """CSR: consumer nodes of each tensor, unique."""
    in_ptr: np.ndarray
    in_idx: np.ndarray
    """CSR: activation tensors each node reads (implicit body reads included), unique."""
    out_ptr: np.ndarray
    out_idx: np.ndarray
    is_graph_output: np.ndarray
    """bool [T]."""
    weight_names: tuple[str, ...]
    weight_bytes: np.ndarray
    """int64 [W]."""
    weight_types: np.ndarray
    """int32 [W]: ONNX element type of each weight (``TensorProto.FLOAT`` ...), for precision changes."""
    nw_ptr: np.ndarray
    nw_idx: np.ndarray
    """CSR: weights each node needs on its device."""
    topo_order: np.ndarray
    """A topological order of the nodes (the file's order when it already is one)."""

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_names)

    def consumers(self, tensor: int) -> np.ndarray:
        return self.cons_idx[self.cons_ptr[tensor] : self.cons_ptr[tensor + 1]]

    def inputs(self, node: int) -> np.ndarray:
        return self.in_idx[self.in_ptr[node] : self.in_ptr[node + 1]]

    def outputs(self, node: int) -> np.ndarray:
        return self.out_idx[self.out_ptr[node] : self.out_ptr[node + 1]]

    def weights(self, node: int) -> np.ndarray:
        return self.nw_idx[self.nw_ptr[node] : self.nw_ptr[node + 1]]

    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """The nodes each node reads from, sorted (graph inputs and weights are no node)."""
        producer = self.producer.tolist()
        return tuple(
            tuple(sorted({producer[t] for t in self.inputs(q).tolist() if producer[t] >= 0}))
            for q in range(self.num_nodes)
        )


def csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    flat = np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


def body_outer_references(node: onnx.NodeProto) -> list[str]:
    """Names a node's bodies read from the enclosing scope, in first-use order."""
    refs: dict[str, None] = {}
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            _collect_outer(attr.g, set(), refs)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for sub in attr.graphs:
                _collect_outer(sub, set(), refs)
    return list(refs)


def _collect_outer(graph: onnx.GraphProto, outer_defined: set[str], refs: dict[str, None]) -> None:
    defined = set(outer_defined)
    defined.update(i.name for i in graph.input)
    defined.update(t.name for t in graph.initializer)
    defined.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                refs.setdefault(name, None)
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                inner: dict[str, None] = {}
                _collect_outer(sub, defined, inner)
                for name in inner:
                    if name not in defined:
                        refs.setdefault(name, None)
        defined.update(o for o in node.output if o)


def _private_weights(node: onnx.NodeProto) -> list[tuple[str, int, int]]:
    """Weights a node carries itself (name, bytes, element type): a Constant's value, tensors in its bodies."""
    found: list[tuple[str, int, int]] = []
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                name = node.output[0] if node.output else node.name
                found.append((name, tensor_nbytes(attr.t), attr.t.data_type))
            elif attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                values = attr.sparse_tensor.values
                found.append((node.output[0], tensor_nbytes(values), values.data_type))
            elif attr.type == onnx.AttributeProto.FLOATS:
                found.append((node.output[0], 4 * len(attr.floats), onnx.TensorProto.FLOAT))
            elif attr.type == onnx.AttributeProto.INTS:
                found.append((node.output[0], 8 * len(attr.ints), onnx.TensorProto.INT64))
        return found
    for attr in node.attribute:
        if attr.type in _GRAPH_ATTRS:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                _body_weights(sub, f"{node.name or node.op_type}/{attr.name}", found)
    return found


def _body_weights(graph: onnx.GraphProto, prefix: str, found: list[tuple[str, int, int]]) -> None:
    for tensor in graph.initializer:
        found.append((f"{prefix}/{tensor.name}", tensor_nbytes(tensor), tensor.data_type))
    for sparse in graph.sparse_initializer:
        values = sparse.values
        found.append((f"{prefix}/{values.name}", tensor_nbytes(values), values.data_type))
    for inner in graph.node:
        for name, size, elem in _private_weights(inner):
            found.append((f"{prefix}/{name}", size, elem))


def build_dataflow(graph: onnx.GraphProto) -> Dataflow:
    """Index ``graph``; dangling inputs, duplicate outputs and cycles are ``ModelInvalidError``."""
    nodes = list(graph.node)
    if not nodes:
        raise ModelInvalidError("the model has no nodes: there is nothing to shard")
    initializers: dict[str, int] = {}
    weight_names: list[str] = []
    weight_bytes: list[int] = []
    weight_types: list[int] = []
    for tensor in graph.initializer:
        initializers[tensor.name] = len(weight_names)
        weight_names.append(tensor.name)
        weight_bytes.append(tensor_nbytes(tensor))
        weight_types.append(tensor.data_type)
    for sparse in graph.sparse_initializer:
        initializers[sparse.values.name] = len(weight_names)
        weight_names.append(sparse.values.name)
        weight_bytes.append(tensor_nbytes(sparse.values))
        weight_types.append(sparse.values.data_type)

    tensor_index: dict[str, int] = {}
    tensor_names: list[str] = []
    producer: list[int] = []
    for value in graph.input:
        if value.name in initializers or value.name in tensor_index:
            continue
        tensor_index[value.name] = len(tensor_names)
        tensor_names.append(value.name)
        producer.append(-1)
    out_rows: list[list[int]] = []
    for n, node in enumerate(nodes):
        row = []
        for name in node.output:
            if not name:
                continue
            if name in tensor_index or name in initializers:
                raise ModelInvalidError(
                    f"tensor {name!r} is produced twice (by node {node.name or node.op_type!r} and earlier)"
                )
            tensor_index[name] = len(tensor_names)
            tensor_names.append(name)
            producer.append(n)
            row.append(tensor_index[name])
        out_rows.append(row)

    in_rows: list[list[int]] = []
    nw_rows: list[list[int]] = []
    cons_rows: list[list[int]] = [[] for _ in tensor_names]
    dangling: list[str] = []
    for n, node in enumerate(nodes):
        names = [x for x in node.input if x]
        if any(a.type in _GRAPH_ATTRS for a in node.attribute):
            names.extend(body_outer_references(node))
        acts: dict[int, None] = {}
        weights: dict[int, None] = {}
        for name in names:
            t = tensor_index.get(name)
            if t is not None:
                acts.setdefault(t, None)
            elif name in initializers:
                weights.setdefault(initializers[name], None)
            else:
                dangling.append(f"{node.name or node.op_type!r} reads {name!r}")
        for wname, size, elem in _private_weights(node):
            weights.setdefault(len(weight_names), None)
            weight_names.append(f"{node.name}:{wname}" if node.name else wname)
            weight_bytes.append(size)
            weight_types.append(elem)
        for t in acts:
            cons_rows[t].append(n)
        in_rows.append(list(acts))
        nw_rows.append(list(weights))
    if dangling:
        shown = "; ".join(dangling[:5])
        more = f" (and {len(dangling) - 5} more)" if len(dangling) > 5 else ""
        raise ModelInvalidError(
            f"dangling inputs: no node, graph input or initializer provides them: {shown}{more}"
        )

    outputs = {o.name for o in graph.output}
    missing = [name for name in outputs if name not in tensor_index and name not in initializers]
    if missing:
        raise ModelInvalidError(f"graph outputs {missing[:5]} are not produced by any node")
    is_output = np.fromiter(
        (name in outputs for name in tensor_names), dtype=bool, count=len(tensor_names)
    )

    cons_ptr, cons_idx = csr(cons_rows)
    in_ptr, in_idx = csr(in_rows)
    out_ptr, out_idx = csr(out_rows)
    producer_arr = np.asarray(producer, dtype=np.int64)
    order = topological_order(len(nodes), in_rows, producer_arr, cons_rows, out_rows)
    if len(order) < len(nodes):
        placed = np.zeros(len(nodes), dtype=bool)
        placed[order] = True
        stuck = [nodes[i].name or f"#{i} {nodes[i].op_type}" for i in np.flatnonzero(~placed)[:5]]
        raise ModelInvalidError(
            f"the graph has a cycle through {len(nodes) - len(order)} node(s), e.g. {stuck}"
        )
    nw_ptr, nw_idx = csr(nw_rows)
    absurd = next(
        (name for name, size in zip(weight_names, weight_bytes, strict=True) if size > 2**50), None
    )
    if absurd is not None:
        raise ModelInvalidError(f"weight {absurd!r} declares more than a petabyte: absurd dims")
    return Dataflow(
        node_names=tuple(node.name for node in nodes),
        op_types=tuple(node.op_type for node in nodes),
        tensor_names=tuple(tensor_names),
        producer=producer_arr,
        cons_ptr=cons_ptr,
        cons_idx=cons_idx,
        in_ptr=in_ptr,
        in_idx=in_idx,
        out_ptr=out_ptr,
        out_idx=out_idx,
        is_graph_output=is_output,
        weight_names=tuple(weight_names),
        weight_bytes=np.asarray(weight_bytes, dtype=np.int64),
        weight_types=np.asarray(weight_types, dtype=np.int32),
        nw_ptr=nw_ptr,
        nw_idx=nw_idx,
        topo_order=np.asarray(order, dtype=np.int64),
    )


def topological_order(
    n: int,
    in_rows: list[list[int]],
    producer: np.ndarray,
    cons_rows: list[list[int]],
    out_rows: list[list[int]],
) -> list[int]:
    """Kahn's algorithm, taking the lowest file index first so a sorted file keeps its order."""
    indegree = [sum(1 for t in row if producer[t] >= 0) for row in in_rows]
    if all(all(producer[t] < i for t in row) for i, row in enumerate(in_rows)):
        return list(range(n))
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for t in out_rows[i]:
            for c in cons_rows[t]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(ready, c)
    return order
