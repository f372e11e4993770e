"""Shapes of every tensor once the inputs are static: values propagated through shape subgraphs.

Exporters compute Reshape targets, masks and pads at run time (``Shape → Gather → Unsqueeze →
Concat → Reshape``, ``Range``, ``Expand``, ``ConstantOfShape``, ``Where``, computed ``Pad``s).
ONNX's own inference with data propagation stops at most of them; onnxruntime's symbolic shape
inference evaluates them (docs/shapes.md has the measurement), so it runs first and ONNX's
inference is the fallback. Both run on a copy whose weights are typed graph inputs, so no weight
byte is read and nothing is written anywhere.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx

from sharderd.graph.tensors import tensor_nbytes

__all__ = [
    "DataDependentShape",
    "Propagation",
    "TensorType",
    "collect_types",
    "inference_copy",
    "propagate_shapes",
    "propagate_value_infos",
]

_KEEP_VALUE_BYTES = 4096
"""Initializers up to this size keep their values (Reshape targets, pads, axes); larger ones are weights."""

_SSI_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


@dataclass(frozen=True, slots=True)
class TensorType:
    elem_type: int
    shape: tuple[int, ...] | None
    """None when any dim stays unknown after inference."""


@dataclass(frozen=True, slots=True)
class DataDependentShape:
    """A tensor whose size depends on the data (NonZero, TopK with a computed k, ...)."""

    tensor: str
    node: str
    op_type: str
    costed_as: str
    """How the plan counted it, for the report."""


@dataclass(frozen=True, slots=True)
class Propagation:
    types: Mapping[str, TensorType]
    engine: str
    """``onnxruntime-symbolic`` or ``onnx`` (the fallback)."""
    error: str | None
    """Why the first engine was not used, if it was not."""
    data_dependent: tuple[DataDependentShape, ...]
    notes: tuple[str, ...]
    """What the inference engine warned about (uncertain comparisons, unsupported broadcasts)."""


def inference_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with weights turned into typed graph inputs: inference sees shapes, never bytes.

    Small inline initializers keep their values, since shape subgraphs read them. External ones
    never do: reading them would read weights from disk.
    """
    light = onnx.ModelProto()
    light.ir_version = max(model.ir_version, 4)  # initializers need not be inputs from IR 4 on
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    source, graph = model.graph, light.graph
    graph.name = source.name
    graph.node.extend(source.node)
    stubbed: set[str] = set()
    for tensor in source.initializer:
        if (
            tensor.data_location != onnx.TensorProto.EXTERNAL
            and tensor_nbytes(tensor) <= _KEEP_VALUE_BYTES
        ):
            graph.initializer.append(tensor)
            continue
        stubbed.add(tensor.name)
        graph.input.append(
            onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
        )
    kept = {t.name for t in graph.initializer}
    graph.input.extend(v for v in source.input if v.name not in kept and v.name not in stubbed)
    graph.output.extend(source.output)
    graph.sparse_initializer.extend(source.sparse_initializer)
    return light


def propagate_shapes(light: onnx.ModelProto) -> Propagation:
    """Infer every tensor's type on ``light`` (an ``inference_copy`` with static inputs)."""
    notes: list[str] = []
    inferred, engine, error = _infer(light, notes)
    raw: dict[str, onnx.ValueInfoProto] = {}
    _collect_value_infos(inferred.graph, raw)
    types, data_dependent = _resolve(inferred.graph, raw)
    return Propagation(types, engine, error, tuple(data_dependent), tuple(dict.fromkeys(notes)))


def propagate_value_infos(light: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Tensor name → inferred ``ValueInfoProto``, symbolic dims kept (for splitting into stages)."""
    inferred, _, _ = _infer(light, [])
    raw: dict[str, onnx.ValueInfoProto] = {}
    _collect_value_infos(inferred.graph, raw)
    return raw


def _infer(light: onnx.ModelProto, notes: list[str]) -> tuple[onnx.ModelProto, str, str | None]:
    try:
        return _symbolic(light, notes), "onnxruntime-symbolic", None
    except Exception as exc:  # the library raises bare Exception and assertion errors
        error = f"onnxruntime symbolic shape inference: {_first_line(exc)}"
        return _onnx_inference(light), "onnx", error


def collect_types(graph: onnx.GraphProto) -> dict[str, TensorType]:
    """Static types of what ``graph`` (and its bodies) declares; symbolic dims make a shape unknown."""
    raw: dict[str, onnx.ValueInfoProto] = {}
    _collect_value_infos(graph, raw)
    types = {name: _static(value) for name, value in raw.items()}
    _add_constants(graph, types)
    return {k: v for k, v in types.items() if v is not None}


def _symbolic(light: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # The library's infer_shapes() saves a model into the working directory when inference is
    # incomplete; its steps are driven here instead, so the engine writes nothing.
    ssi = SymbolicShapeInference(
        int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0
    )
    # One op the library cannot handle (it asserts: Concat of shape values on axis 1, an If whose
    # branch outputs carry no type) must not lose every other shape: such a node keeps what ONNX's
    # single-node inference, which runs before each handler, found for it.
    for op, handler in list(ssi.dispatcher_.items()):
        ssi.dispatcher_[op] = _guarded(handler, op, notes, lambda: ssi.known_vi_)
    ssi._onnx_infer_single_node = _guarded(ssi._onnx_infer_single_node, "onnx", notes, dict)
    with _captured(notes):
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
                f"{where}: symbolic inference ({op}) failed ({_first_line(exc)}); its outputs keep ONNX's inference"
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


def _onnx_inference(light: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(
            light, check_type=False, strict_mode=False, data_prop=_data_prop_is_safe(light)
        )
    except Exception:
        return light


_DATA_PROP_MAX_ELEMENTS = 1 << 16
"""onnx's data propagation keeps ~150 bytes per element of 1-D tensors: shape vectors are tiny,
a 2**24-element input would take gigabytes. Bigger 1-D tensors switch it off."""


def _data_prop_is_safe(model: onnx.ModelProto) -> bool:
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if (
            len(dims) == 1
            and dims[0].HasField("dim_value")
            and dims[0].dim_value > _DATA_PROP_MAX_ELEMENTS
        ):
            return False
    tensors = [*model.graph.initializer]
    tensors += [
        a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    return not any(len(t.dims) == 1 and t.dims[0] > _DATA_PROP_MAX_ELEMENTS for t in tensors)


@contextmanager
def _captured(notes: list[str]) -> Iterator[None]:
    """Route the library's warnings into ``notes`` instead of stderr, for the duration of the call."""
    logger = logging.getLogger(_SSI_LOGGER)

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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _collect_value_infos(graph: onnx.GraphProto, out: dict[str, onnx.ValueInfoProto]) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and (
            value.name not in out or _static(out[value.name]) is None
        ):
            out[value.name] = value
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _collect_value_infos(attr.g, out)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _collect_value_infos(sub, out)


def _add_constants(graph: onnx.GraphProto, types: dict[str, TensorType | None]) -> None:
    for tensor in graph.initializer:
        types[tensor.name] = TensorType(tensor.data_type, tuple(tensor.dims))
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = TensorType(attr.t.data_type, tuple(attr.t.dims))
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                _add_constants(sub, types)


def _static(value: onnx.ValueInfoProto) -> TensorType | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return TensorType(tensor_type.elem_type, None)
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return TensorType(tensor_type.elem_type, None)
        dims.append(dim.dim_value)
    return TensorType(tensor_type.elem_type, tuple(dims))


_NEW_DIM = re.compile(r"^(?P<op>[A-Za-z]\w*?)_(?P<index>\d+)_o(?P<out>\d+)__d(?P<dim>\d+)$")
"""How the symbolic inference names a dim a top-level node creates (``NonZero_12_o0__d1``)."""

_BOUNDED_BY_INPUT_SIZE = {"NonZero", "Compress", "Unique", "NonMaxSuppression"}
"""Ops whose data-dependent output dim is at most the element count of their first input."""


def _resolve(
    graph: onnx.GraphProto, raw: Mapping[str, onnx.ValueInfoProto]
) -> tuple[dict[str, TensorType], list[DataDependentShape]]:
    """Static types; dims a node made up (data-dependent) are bounded where the op allows it."""
    types: dict[str, TensorType | None] = {}
    pending: dict[str, onnx.ValueInfoProto] = {}
    for name, value in raw.items():
        static = _static(value)
        types[name] = static
        if static is not None and static.shape is None and value.type.tensor_type.HasField("shape"):
            pending[name] = value
    _add_constants(graph, types)
    found: list[DataDependentShape] = []
    if pending:
        bounds, made_by = _symbol_bounds(graph, types)
        for name, value in pending.items():
            known = types[name]
            if known is not None and known.shape is not None:
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
    return {k: v for k, v in types.items() if v is not None}, found


def _symbol_bounds(
    graph: onnx.GraphProto, types: Mapping[str, TensorType | None]
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
