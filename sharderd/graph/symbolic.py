"""onnxruntime's symbolic shape inference, for what the fixed point (graph/fixed_point.py) leaves
unknown: sizes that depend on the data (NonZero, a TopK with a computed k), bounded here, and
control-flow bodies. It is the only user of sympy, and both load when a model needs them.

``onnxruntime.tools``' package ``__init__`` imports torch whenever torch is installed (for an
export helper sharderd never calls): about 3 s of CPU and 600 MB before the first shape. The
inference module is a single file that needs only onnx, numpy, sympy and packaging, so
``_load_library`` loads that file alone, and falls back to the ordinary import when it is not where
onnxruntime ships it.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

from sharderd.graph.shape_types import (
    DataDependentShape,
    TensorType,
    add_constants,
    static_type,
)

__all__ = ["first_line", "resolve_symbols", "symbolic_inference"]

_LIBRARY = "onnxruntime.tools.symbolic_shape_infer"


@cache
def _load_library() -> ModuleType:
    """onnxruntime's ``symbolic_shape_infer`` module, without its package's torch import."""
    spec = importlib.util.find_spec("onnxruntime")  # finds the package without importing it
    origin = spec.origin if spec is not None else None
    if origin is not None:
        path = Path(origin).parent / "tools" / "symbolic_shape_infer.py"
        if path.is_file():
            single = importlib.util.spec_from_file_location(f"sharderd.graph._{path.stem}", path)
            if single is not None and single.loader is not None:
                module = importlib.util.module_from_spec(single)
                single.loader.exec_module(module)
                return module
    return importlib.import_module(_LIBRARY)


def symbolic_inference(light: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """``light`` with every value info the library infers; its warnings and per-node failures go
    to ``notes``."""
    library = _load_library()

    # The library's infer_shapes() saves a model into the working directory when inference is
    # incomplete; its steps are driven here instead, so the engine writes nothing.
    ssi = library.SymbolicShapeInference(
        int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0
    )
    # One op the library cannot handle (it asserts: Concat of shape values on axis 1, an If whose
    # branch outputs carry no type) must not lose every other shape: such a node keeps what ONNX's
    # single-node inference, which runs before each handler, found for it.
    for op, handler in list(ssi.dispatcher_.items()):
        ssi.dispatcher_[op] = _guarded(handler, op, notes, lambda: ssi.known_vi_)
    ssi._onnx_infer_single_node = _guarded(ssi._onnx_infer_single_node, "onnx", notes, dict)
    with _captured(library.logger, notes):
        ssi._preprocess(light)
        while ssi.run_:
            ssi._infer_impl()
        ssi._update_output_from_vi()
    return ssi.out_mp_


def _guarded(handler, op: str, notes: list[str], known):  # known: () -> {name: ValueInfoProto}
    def run(node: onnx.NodeProto) -> None:
        try:
            handler(node)
        except Exception as exc:  # the library asserts on inputs it does not expect
            if op == "Concat" and _retry_concat_on_axis_0(handler, node, known()):
                return
            where = f"{node.op_type} node {node.name!r}"
            notes.append(
                f"{where}: symbolic inference ({op}) failed ({first_line(exc)}); its outputs keep ONNX's inference"
            )

    return run


def _retry_concat_on_axis_0(
    handler, node: onnx.NodeProto, known: Mapping[str, onnx.ValueInfoProto]
) -> bool:
    """Paddle joins shape vectors with ``axis=-1``; for 1-D inputs that is axis 0, the only axis the
    library accepts for shape values."""
    axis = next((a for a in node.attribute if a.name == "axis"), None)
    if axis is None or axis.i != -1:
        return False
    for name in node.input:
        value = known.get(name)
        if value is None or len(value.type.tensor_type.shape.dim) != 1:
            return False
    same = onnx.NodeProto()
    same.CopyFrom(node)
    next(a for a in same.attribute if a.name == "axis").i = 0
    try:
        handler(same)
    except Exception:
        return False
    return True


@contextmanager
def _captured(logger: logging.Logger, notes: list[str]) -> Iterator[None]:
    """Route the library's warnings into ``notes`` instead of stderr, for the duration of the call."""

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    handler = _Collect(logging.WARNING)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


_NEW_DIM = re.compile(r"^(?P<op>[A-Za-z]\w*?)_(?P<index>\d+)_o(?P<out>\d+)__d(?P<dim>\d+)$")
"""How the symbolic inference names a dim a top-level node creates (``NonZero_12_o0__d1``)."""

_BOUNDED_BY_INPUT_SIZE = {"NonZero", "Compress", "Unique", "NonMaxSuppression"}
"""Ops whose data-dependent output dim is at most the element count of their first input."""


def resolve_symbols(
    graph: onnx.GraphProto, raw: Mapping[str, onnx.ValueInfoProto]
) -> tuple[dict[str, TensorType], list[DataDependentShape]]:
    """Static types; dims a node made up (data-dependent) are bounded where the op allows it."""
    types: dict[str, TensorType] = {}
    pending: dict[str, onnx.ValueInfoProto] = {}
    for name, value in raw.items():
        static = static_type(value)
        types[name] = static
        if static.shape is None and value.type.tensor_type.HasField("shape"):
            pending[name] = value
    add_constants(graph, types)
    found: list[DataDependentShape] = []
    if pending:
        bounds, made_by = _symbol_bounds(graph, types)
        for name, value in pending.items():
            if types[name].shape is not None:
                continue
            shape, symbols = _bounded_shape(value, bounds)
            makers = [made_by[s] for s in symbols if s in made_by]
            if not makers:
                continue  # unknown for another reason: listed as unknown by the coster
            node, op = makers[0]
            if shape is None:
                found.append(DataDependentShape(name, node, op, "unknown size: counted as 0 bytes"))
                continue
            types[name] = TensorType(value.type.tensor_type.elem_type, shape)
            found.append(DataDependentShape(name, node, op, f"upper bound {list(shape)}"))
    return types, found


def _symbol_bounds(
    graph: onnx.GraphProto, types: Mapping[str, TensorType]
) -> tuple[dict[str, int], dict[str, tuple[str, str]]]:
    bounds: dict[str, int] = {}
    made_by: dict[str, tuple[str, str]] = {}
    nodes = graph.node
    for symbol, node_index, dim in _made_up_symbols(graph):
        node = nodes[node_index]
        made_by[symbol] = (node.name or f"#{node_index} {node.op_type}", node.op_type)
        source = types.get(node.input[0]) if node.input else None
        if source is None or source.shape is None:
            continue
        if node.op_type in _BOUNDED_BY_INPUT_SIZE:
            bounds[symbol] = int(np.prod(source.shape, dtype=np.int64)) if source.shape else 1
        elif node.op_type == "TopK":
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
            if -len(source.shape) <= axis < len(source.shape):
                bounds[symbol] = source.shape[axis]
        elif node.op_type == "NonMaxSuppression" and dim == 0:
            bounds[symbol] = int(np.prod(source.shape[:2], dtype=np.int64))
    return bounds, made_by


def _made_up_symbols(graph: onnx.GraphProto) -> Iterator[tuple[str, int, int]]:
    seen: set[str] = set()
    for value in graph.value_info:
        for dim in value.type.tensor_type.shape.dim:
            for symbol in re.findall(r"[A-Za-z]\w*_\d+_o\d+__d\d+", dim.dim_param):
                match = _NEW_DIM.match(symbol)
                if symbol in seen or match is None:
                    continue
                seen.add(symbol)
                index = int(match["index"])
                if index < len(graph.node) and graph.node[index].op_type == match["op"]:
                    yield symbol, index, int(match["dim"])


def _bounded_shape(
    value: onnx.ValueInfoProto, bounds: Mapping[str, int]
) -> tuple[tuple[int, ...] | None, list[str]]:
    """Evaluate each dim with made-up symbols at their bounds; None when a symbol has no bound."""
    import sympy

    dims: list[int] = []
    symbols: list[str] = []
    complete = True
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
            continue
        names = re.findall(r"[A-Za-z_]\w*", dim.dim_param)
        symbols.extend(names)
        if not dim.dim_param or any(n not in bounds for n in names):
            complete = False
            continue
        try:
            expr = sympy.sympify(dim.dim_param, locals={n: sympy.Symbol(n) for n in names})
            size = int(expr.subs({sympy.Symbol(n): bounds[n] for n in names}))
        except (sympy.SympifyError, TypeError, ValueError):
            complete = False
            continue
        dims.append(max(size, 0))
    return (tuple(dims) if complete else None), symbols
