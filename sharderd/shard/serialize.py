"""Rewrite one node too large for a device into k pieces that are ordinary nodes afterwards.

- **rows** (``Gather`` over an initializer table, axis 0, an embedding): piece i holds rows
  ``[lo, hi)`` of the table plus one zero row. Its indices are normalised (``Mod`` by the vocabulary,
  so negative indices count from the end as Gather allows), shifted by ``-lo``, and those outside
  ``[0, hi - lo)`` are sent to the zero row (``Where``); the partial lookups add up (``Sum``) to the
  original output, exactly: every index hits one piece, the others contribute zeros.
- **columns** (``MatMul`` with a 2-D initializer weight, or ``Gemm`` with one): piece i multiplies
  by columns ``[lo, hi)`` of the weight (rows when ``transB``; the bias sliced the same way when it
  has the output's width) and the pieces' outputs are concatenated on the last axis (``Concat``).

``rewrite_of`` is the rewrite without a weight byte (``serialize_price`` prices it); ``serialize_node``
writes it, reading weights through ``numpy.memmap`` of the external data file (or the inline tensor)
a bounded chunk at a time into an external data file (pieces up to ``inline_limit`` stay inline).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "SPLIT_OPS",
    "PieceWeight",
    "Rewrite",
    "SerializeError",
    "Serialized",
    "WeightRows",
    "max_pieces",
    "rewrite_of",
    "serialize_node",
    "splittable",
    "weight_input",
    "weight_view",
]

_CHUNK_BYTES = 1 << 26
"""Bytes copied per write when a piece is streamed to its data file (bounds peak memory)."""


class SerializeError(ValueError):
    """The node is not one this module can split (op, axis, or weight not a constant)."""


@dataclass(frozen=True, slots=True)
class Serialized:
    """What one rewrite did, for the report."""

    node: str
    op: str
    kind: Literal["rows", "columns"]
    pieces: int
    piece_nodes: tuple[str, ...]
    """Names of the nodes that hold a slice of the weight (one per piece)."""
    reason: Literal["too_big", "bottleneck"] = "too_big"
    """Why: its weights alone exceed a device, or its own cost held the bottleneck up
    (``plan.serialize_choice``)."""
    bottleneck_s: tuple[float, float] | None = None
    """For ``bottleneck``: the predicted bottleneck (seconds) of the plan before and after."""


def _initializers(model: onnx.ModelProto) -> dict[str, TensorProto]:
    return {t.name: t for t in model.graph.initializer}


SPLIT_OPS = frozenset({"Gather", "MatMul", "Gemm"})
"""The ops ``splittable`` can take at all (the rest are never looked at)."""


def splittable(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    inits: Mapping[str, TensorProto] | None = None,
) -> Literal["rows", "columns"] | None:
    """The kind of rewrite ``serialize_node`` can apply to ``node`` (``inits``: by name), or None."""
    if node.op_type not in SPLIT_OPS:
        return None
    inits = _initializers(model) if inits is None else inits
    if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in inits:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        dims = inits[node.input[0]].dims
        if axis in (0, -len(dims)) and len(dims) >= 1 and dims[0] >= 2:
            return "rows"
    if node.op_type in ("MatMul", "Gemm") and len(node.input) >= 2 and node.input[1] in inits:
        dims = inits[node.input[1]].dims
        if len(dims) == 2 and min(dims) >= 2:
            bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
            return "columns" if not bias or bias in inits else None
    return None


@dataclass(frozen=True, slots=True)
class WeightRows:
    """Rows of a weight, read on demand: a memmap of just those rows of the external data file
    (unmapped once copied, so the pages never pile up in memory), or slices of the inline array."""

    shape: tuple[int, ...]
    dtype: np.dtype
    inline: np.ndarray | None
    file: Path | None
    offset: int

    def rows(self, lo: int, hi: int) -> np.ndarray:
        if self.inline is not None:
            return np.array(self.inline[lo:hi])
        assert self.file is not None
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        view = np.memmap(self.file, dtype=self.dtype, mode="r", offset=self.offset + lo * row_bytes,
                         shape=(hi - lo, *self.shape[1:]))  # fmt: skip
        copied = np.array(view)
        del view
        return copied


def weight_view(tensor: TensorProto, base_dir: Path) -> WeightRows:
    """The tensor's values, by rows: from its external data file, or the inline array."""
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(int(d) for d in tensor.dims)
    if tensor.data_location != TensorProto.EXTERNAL:
        return WeightRows(shape, dtype, numpy_helper.to_array(tensor), None, 0)
    info = {e.key: e.value for e in tensor.external_data}
    return WeightRows(shape, dtype, None, base_dir / info["location"], int(info.get("offset", 0)))


def _bounds(size: int, pieces: int) -> list[tuple[int, int]]:
    """``pieces`` contiguous ranges covering ``[0, size)``, sizes differing by at most one."""
    edges = [size * i // pieces for i in range(pieces + 1)]
    return list(itertools.pairwise(edges))


class _Sink:
    """Where piece tensors go: inline below ``inline_limit``, else appended to one data file."""

    def __init__(self, data_path: Path | None, inline_limit: int) -> None:
        self.data_path, self.inline_limit, self.offset = data_path, inline_limit, 0

    def tensor(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype, chunks: Iterator[np.ndarray]
    ) -> TensorProto:
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if self.data_path is None or nbytes <= self.inline_limit:
            array = np.concatenate(list(chunks), axis=0).reshape(shape)
            return numpy_helper.from_array(np.ascontiguousarray(array), name)
        start = -(-self.offset // 4096) * 4096
        with open(self.data_path, "r+b" if self.offset else "wb") as f:
            f.seek(start)
            for chunk in chunks:
                f.write(np.ascontiguousarray(chunk).tobytes())
        self.offset = start + nbytes
        out = TensorProto(
            name=name, dims=list(shape), data_type=helper.np_dtype_to_tensor_dtype(dtype)
        )
        out.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_path.name),
            ("offset", start),
            ("length", nbytes),
        ):
            out.external_data.add(key=key, value=str(value))
        return out


def _row_chunks(
    source: WeightRows, rows: range, cols: slice, extra_zero_row: bool
) -> Iterator[np.ndarray]:
    """``source[rows, cols]`` a bounded number of rows at a time (plus a zero row if asked)."""
    row_bytes = int(np.prod(source.shape[1:], dtype=np.int64)) * source.dtype.itemsize
    step = max(1, _CHUNK_BYTES // max(1, row_bytes))
    for lo in range(rows.start, rows.stop, step):
        chunk = source.rows(lo, min(lo + step, rows.stop))
        yield np.ascontiguousarray(chunk[:, cols]) if chunk.ndim > 1 else chunk
    if extra_zero_row:
        zero = np.zeros((1, *source.shape[1:]), dtype=source.dtype)
        yield zero[:, cols] if zero.ndim > 1 else zero


@dataclass(frozen=True, slots=True)
class PieceWeight:
    """One initializer a rewrite adds: its name, shape and type, and where its values come from."""

    name: str
    shape: tuple[int, ...]
    data_type: int
    kind: Literal["slice", "bias", "scalar"]
    """``slice``: rows ``rows`` (and columns ``cols``) of initializer ``source``, plus a zero row
    when ``zero_row``, streamed; ``bias``: the last axis of ``source`` cut to ``cols``, inline;
    ``scalar``: ``value``."""
    source: str = ""
    rows: tuple[int, int] = (0, 0)
    cols: tuple[int, int] | None = None
    zero_row: bool = False
    value: int = 0


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What ``serialize_node`` does to the graph, known before any weight byte is read: the nodes
    that replace the one at ``position`` (the last one writes its output), the initializers they
    add, and the original weight, dropped when nothing else reads it."""

    position: int
    nodes: tuple[onnx.NodeProto, ...]
    weights: tuple[PieceWeight, ...]
    record: Serialized
    dropped: str | None


def rewrite_of(
    model: onnx.ModelProto, node_name: str, pieces: int, *, index_type: int | None = None
) -> Rewrite:
    """How ``serialize_node`` cuts ``node_name`` into ``pieces`` (see module doc); reads shapes and
    types only. ``index_type``: the element type of a Gather's indices, when the caller knows it."""
    position = next((i for i, n in enumerate(model.graph.node) if n.name == node_name), None)
    if position is None:
        raise SerializeError(f"no node named {node_name!r}")
    node = model.graph.node[position]
    kind = splittable(model, node)
    if kind is None:
        raise SerializeError(f"node {node_name!r} ({node.op_type}) cannot be serialized")
    inits = _initializers(model)
    weight = inits[weight_input(node, kind)]
    size = max_pieces(node, kind, weight)
    if not 2 <= pieces <= size:
        raise SerializeError(f"cannot split {size} {kind} into {pieces} pieces")
    if kind == "rows":
        index = _index_type(model, node.input[1]) if index_type is None else index_type
        nodes, weights, piece_nodes = _rows(node, weight, _bounds(size, pieces), index)
    else:
        nodes, weights, piece_nodes = _columns(node, weight, _bounds(size, pieces), inits)
    others = (n for n in (*model.graph.node, *nodes) if n is not node)
    dropped = None if any(weight.name in n.input for n in others) else weight.name
    record = Serialized(node_name, node.op_type, kind, pieces, tuple(piece_nodes))
    return Rewrite(position, tuple(nodes), tuple(weights), record, dropped)


def serialize_node(
    model: onnx.ModelProto,
    node_name: str,
    pieces: int,
    *,
    base_dir: Path,
    data_path: Path | None = None,
    inline_limit: int = 1 << 20,
) -> tuple[onnx.ModelProto, Serialized]:
    """A copy of ``model`` with node ``node_name`` rewritten into ``pieces`` pieces (see module doc).

    ``base_dir`` is where the model's external data lives; ``data_path`` the file the sliced weights
    over ``inline_limit`` bytes are written to (None: all inline). The original weight is dropped
    when no other node uses it.
    """
    rewrite = rewrite_of(model, node_name, pieces)
    out = copy.deepcopy(model)
    sink = _Sink(data_path, inline_limit)
    inits = _initializers(out)
    out.graph.initializer.extend(_filled(w, inits, base_dir, sink) for w in rewrite.weights)
    del out.graph.node[rewrite.position]
    for offset, new in enumerate(rewrite.nodes):
        out.graph.node.insert(rewrite.position + offset, new)
    if rewrite.dropped is not None:
        out.graph.initializer.remove(inits[rewrite.dropped])
    return out, rewrite.record


def _filled(
    spec: PieceWeight, inits: dict[str, TensorProto], base_dir: Path, sink: _Sink
) -> TensorProto:
    """The initializer ``spec`` describes, its values read from the model (a bounded chunk of a
    slice at a time) and written through ``sink``."""
    if spec.kind == "scalar":
        return _scalar(spec.name, spec.value, spec.data_type)
    source = weight_view(inits[spec.source], base_dir)
    if spec.kind == "bias":
        values = source.rows(0, source.shape[0]) if source.shape else np.array(source.inline)
        assert spec.cols is not None
        lo, hi = spec.cols
        return numpy_helper.from_array(np.ascontiguousarray(values[..., lo:hi]), spec.name)
    cols = slice(None) if spec.cols is None else slice(*spec.cols)
    chunks = _row_chunks(source, range(*spec.rows), cols, extra_zero_row=spec.zero_row)
    return sink.tensor(spec.name, spec.shape, source.dtype, chunks)


_Pieces = tuple[list[onnx.NodeProto], list[PieceWeight], list[str]]
"""The nodes replacing the original, the initializers they add, the weight-holding nodes' names."""


def weight_input(node: onnx.NodeProto, kind: str) -> str:
    """The input holding the weight a rewrite of ``kind`` slices: the table of a Gather, else
    the second operand."""
    return str(node.input[0] if kind == "rows" else node.input[1])


def max_pieces(node: onnx.NodeProto, kind: str, weight: TensorProto) -> int:
    """The most pieces ``node`` can be cut into: the table's rows, or the weight's columns (its
    rows for a ``transB`` Gemm)."""
    return int(weight.dims[0] if kind == "rows" or trans_b(node) else weight.dims[1])


def trans_b(node: onnx.NodeProto) -> bool:
    return node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)


def _scalar(name: str, value: int, like: TensorProto | int) -> TensorProto:
    dtype = like if isinstance(like, int) else like.data_type
    return helper.make_tensor(name, dtype, [], [value])


def _rows(
    node: onnx.NodeProto, table: TensorProto, bounds: list[tuple[int, int]], index_type: int
) -> _Pieces:
    name, (_, indices), output = node.name, node.input, node.output[0]
    rest = tuple(int(d) for d in table.dims[1:])
    vocab = f"{name}/serialize/vocab"
    weights = [PieceWeight(vocab, (), index_type, "scalar", value=int(table.dims[0]))]
    normal = f"{name}/serialize/indices"
    nodes = [helper.make_node("Mod", [indices, vocab], [normal], name=f"{name}/serialize/Mod")]
    partials, piece_nodes = [], []
    for i, (lo, hi) in enumerate(bounds):
        p = f"{name}/piece{i}"
        rows = f"{table.name}/rows{lo}_{hi}"
        weights += [
            PieceWeight(rows, (hi - lo + 1, *rest), table.data_type, "slice", table.name, (lo, hi), zero_row=True),
            PieceWeight(f"{p}/lo", (), index_type, "scalar", value=lo),
            PieceWeight(f"{p}/size", (), index_type, "scalar", value=hi - lo),
            PieceWeight(f"{p}/zero", (), index_type, "scalar", value=0),
        ]  # fmt: skip
        nodes += [
            helper.make_node("Sub", [normal, f"{p}/lo"], [f"{p}/shifted"], name=f"{p}/Sub"),
            helper.make_node("Less", [f"{p}/shifted", f"{p}/zero"], [f"{p}/below"], name=f"{p}/Less"),
            helper.make_node("Less", [f"{p}/shifted", f"{p}/size"], [f"{p}/under"], name=f"{p}/LessSize"),
            helper.make_node("Not", [f"{p}/below"], [f"{p}/above"], name=f"{p}/Not"),
            helper.make_node("And", [f"{p}/above", f"{p}/under"], [f"{p}/inside"], name=f"{p}/And"),
            helper.make_node("Where", [f"{p}/inside", f"{p}/shifted", f"{p}/size"], [f"{p}/local"], name=f"{p}/Where"),
            helper.make_node("Gather", [rows, f"{p}/local"], [f"{p}/rows"], name=f"{p}/Gather", axis=0),
        ]  # fmt: skip
        partials.append(f"{p}/rows")
        piece_nodes.append(f"{p}/Gather")
    nodes.append(helper.make_node("Sum", partials, [output], name=f"{name}/serialize/Sum"))
    return nodes, weights, piece_nodes


def _index_type(model: onnx.ModelProto, indices: str) -> int:
    """The element type of ``indices`` (int64 unless the graph says int32)."""
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if vi.name == indices and vi.type.tensor_type.elem_type:
            return int(vi.type.tensor_type.elem_type)
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in inferred.graph.value_info:
        if vi.name == indices and vi.type.tensor_type.elem_type:
            return int(vi.type.tensor_type.elem_type)
    return TensorProto.INT64


def _columns(
    node: onnx.NodeProto,
    weight: TensorProto,
    bounds: list[tuple[int, int]],
    inits: dict[str, TensorProto],
) -> _Pieces:
    name, output = node.name, node.output[0]
    trans = trans_b(node)
    shape = tuple(int(d) for d in weight.dims)
    bias = inits.get(node.input[2]) if node.op_type == "Gemm" and len(node.input) > 2 else None
    width = shape[0] if trans else shape[1]
    cut_bias = bias is not None and len(bias.dims) >= 1 and bias.dims[-1] == width and width > 1
    nodes, weights, outs, piece_nodes = [], [], [], []
    for i, (lo, hi) in enumerate(bounds):
        p = f"{name}/piece{i}"
        if trans:
            piece = PieceWeight(f"{weight.name}/cols{lo}_{hi}", (hi - lo, shape[1]),
                                weight.data_type, "slice", weight.name, (lo, hi))  # fmt: skip
        else:
            piece = PieceWeight(f"{weight.name}/cols{lo}_{hi}", (shape[0], hi - lo),
                                weight.data_type, "slice", weight.name, (0, shape[0]), (lo, hi))  # fmt: skip
        weights.append(piece)
        inputs = [node.input[0], piece.name]
        if bias is not None and cut_bias:
            dims = (*(int(d) for d in bias.dims[:-1]), hi - lo)
            weights.append(PieceWeight(f"{bias.name}/cols{lo}_{hi}", dims, bias.data_type,
                                       "bias", bias.name, cols=(lo, hi)))  # fmt: skip
            inputs.append(weights[-1].name)
        elif bias is not None:
            inputs.append(node.input[2])
        new = helper.make_node(node.op_type, inputs, [f"{p}/out"], name=f"{p}/{node.op_type}")
        new.attribute.extend(node.attribute)
        nodes.append(new)
        outs.append(f"{p}/out")
        piece_nodes.append(new.name)
    nodes.append(
        helper.make_node("Concat", outs, [output], name=f"{name}/serialize/Concat", axis=-1)
    )
    return nodes, weights, piece_nodes
