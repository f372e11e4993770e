"""The ops of shape arithmetic, in numpy, for ``evaluate.ConstantValues``.

onnx's reference evaluator builds a model and an evaluator per node: about 0.5 ms each, and a
13k-node Swin export has 10k constant nodes on the way to its window pads (5 s). These few ops are
nearly all of them (``Constant``, ``Shape``-vector ``Gather``/``Unsqueeze``/``Concat``/``Slice``/
``Cast``, integer arithmetic); each is written here as the ONNX operator defines it, for the inputs
where numpy's own semantics are the operator's (integers and booleans for arithmetic, ``Slice``
from opset 10, ``Unsqueeze``/``Squeeze`` with either axes form). ``run`` returns None for anything
else, and the reference evaluator runs it (tests/graph/test_shape_ops.py checks both agree on every
constant node of the real exports).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx.numpy_helper

__all__ = ["run"]

_Op = Callable[
    [onnx.NodeProto, dict[str, onnx.AttributeProto], list[np.ndarray]], np.ndarray | None
]


def run(node: onnx.NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
    """``node``'s outputs on ``inputs`` (None for an omitted optional input), or None when this
    module does not cover the op or these inputs."""
    op = _OPS.get(node.op_type)
    if op is None or len(node.output) != 1:
        return None
    attrs = {a.name: a for a in node.attribute}
    present = [x for x in inputs if x is not None]
    if len(present) != len(inputs) and node.op_type not in ("Slice", "Squeeze", "Unsqueeze"):
        return None
    try:
        out = op(node, attrs, list(inputs))  # type: ignore[arg-type]
    except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError):
        return None
    return None if out is None else [np.asarray(out)]


def _constant(
    node: onnx.NodeProto, attrs: dict[str, onnx.AttributeProto], _: list
) -> np.ndarray | None:
    if "value" in attrs:
        return onnx.numpy_helper.to_array(attrs["value"].t)
    if "value_int" in attrs:
        return np.array(attrs["value_int"].i, dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(list(attrs["value_ints"].ints), dtype=np.int64)
    if "value_float" in attrs:
        return np.array(attrs["value_float"].f, dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(list(attrs["value_floats"].floats), dtype=np.float32)
    return None  # strings, sparse: the reference evaluator's


def _axes(attrs: dict[str, onnx.AttributeProto], inputs: list, slot: int) -> list[int] | None:
    if len(inputs) > slot and inputs[slot] is not None:
        return [int(a) for a in np.asarray(inputs[slot]).reshape(-1)]
    if "axes" in attrs:
        return list(attrs["axes"].ints)
    return None


def _unsqueeze(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    axes = _axes(attrs, inputs, 1)
    if axes is None:
        return None
    rank = inputs[0].ndim + len(axes)
    normal = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(normal)) != len(normal) or any(not 0 <= a < rank for a in normal):
        return None
    return np.expand_dims(inputs[0], tuple(normal))


def _squeeze(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    axes = _axes(attrs, inputs, 1)
    x = inputs[0]
    if axes is None:
        return np.squeeze(x)
    normal = tuple(a + x.ndim if a < 0 else a for a in axes)
    if any(not 0 <= a < x.ndim or x.shape[a] != 1 for a in normal):
        return None
    return np.squeeze(x, axis=normal)


def _gather(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    x, indices = inputs
    axis = attrs["axis"].i if "axis" in attrs else 0
    if not np.issubdtype(indices.dtype, np.integer) or not -x.ndim <= axis < x.ndim:
        return None
    size = x.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        return None
    return np.take(x, indices, axis=axis)


def _concat(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    if "axis" not in attrs or any(x.ndim == 0 for x in inputs):
        return None
    return np.concatenate(inputs, axis=attrs["axis"].i)


def _cast(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    to = onnx.helper.tensor_dtype_to_np_dtype(attrs["to"].i)
    x = inputs[0]
    exact = (np.integer, np.bool_)
    if not issubclass(x.dtype.type, exact) or to.type not in _TO_FROM_INTEGERS:
        return None  # from floats, rounding and saturation rules: the reference evaluator's
    return x.astype(to)


_TO_FROM_INTEGERS = {np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16}
_TO_FROM_INTEGERS |= {np.uint32, np.uint64, np.float16, np.float32, np.float64}
"""Cast targets numpy's ``astype`` reaches from integers and booleans as ONNX's Cast does."""


def _constant_of_shape(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    shape = [int(d) for d in inputs[0].reshape(-1)]
    if "value" in attrs:
        fill = onnx.numpy_helper.to_array(attrs["value"].t).reshape(-1)
        if fill.size != 1:
            return None
        return np.full(shape, fill[0], dtype=fill.dtype)
    return np.zeros(shape, dtype=np.float32)


def _range(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    start, limit, delta = inputs
    if not all(x.ndim == 0 and issubclass(x.dtype.type, np.integer) for x in inputs):
        return None  # float ranges count their elements with a float ceil: the reference's
    if delta == 0:
        return None
    return np.arange(start, limit, delta, dtype=start.dtype)


def _expand(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    x, shape = inputs
    target = np.broadcast_shapes(x.shape, tuple(int(d) for d in shape.reshape(-1)))
    return np.broadcast_to(x, target).copy()


def _transpose(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    perm = list(attrs["perm"].ints) if "perm" in attrs else None
    return np.transpose(inputs[0], perm).copy()


def _slice(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    if len(inputs) < 3 or inputs[1] is None or inputs[2] is None:
        return None  # Slice-1 (attributes): the reference evaluator's
    x = inputs[0]
    starts, ends = (np.asarray(v).reshape(-1).tolist() for v in inputs[1:3])
    axes = _axes({}, inputs, 3) or list(range(len(starts)))
    steps = (
        np.asarray(inputs[4]).reshape(-1).tolist()
        if len(inputs) > 4 and inputs[4] is not None
        else [1] * len(starts)
    )
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0 or not -x.ndim <= axis < x.ndim:
            return None
        index[axis] = slice(int(start), int(end), int(step))  # Python clamps as ONNX does
    return x[tuple(index)]


def _reshape(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    x, shape = inputs
    target = [int(d) for d in shape.reshape(-1)]
    if not (attrs["allowzero"].i if "allowzero" in attrs else 0):
        target = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(target)]
    return x.reshape(target)


def _elementwise(ufunc: np.ufunc, kinds: tuple[type, ...]) -> _Op:
    """A unary or binary op (``Max``/``Min``: any number of inputs), on inputs of one dtype."""

    def op(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
        dtype = inputs[0].dtype
        if not issubclass(dtype.type, kinds) or any(x.dtype != dtype for x in inputs):
            return None
        if len(inputs) != ufunc.nin and node.op_type not in ("Max", "Min"):
            return None
        return functools.reduce(ufunc, inputs) if ufunc.nin == 2 else ufunc(inputs[0])

    return op


def _divisible(a: np.ndarray, b: np.ndarray) -> bool:
    """Integers on both sides and no zero divisor (float and zero division: the reference's)."""
    integers = issubclass(a.dtype.type, np.integer) and issubclass(b.dtype.type, np.integer)
    return integers and not (b == 0).any()


def _div(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    a, b = inputs
    if not _divisible(a, b):
        return None
    q = np.floor_divide(a, b)  # ONNX's integer Div truncates toward zero
    adjust = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return (q + adjust.astype(q.dtype)).astype(a.dtype)


def _mod(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    a, b = inputs
    if not _divisible(a, b):
        return None
    fmod = attrs["fmod"].i if "fmod" in attrs else 0
    return np.fmod(a, b) if fmod else np.mod(a, b)


def _where(node: onnx.NodeProto, attrs: dict, inputs: list) -> np.ndarray | None:
    condition, x, y = inputs
    if condition.dtype != np.bool_ or x.dtype != y.dtype:
        return None
    return np.where(condition, x, y)


_INT = (np.integer,)
_INT_OR_BOOL = (np.integer, np.bool_)
_OPS: dict[str, _Op] = {
    "Constant": _constant,
    "Identity": lambda node, attrs, inputs: inputs[0],
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Gather": _gather,
    "Concat": _concat,
    "Cast": _cast,
    "Slice": _slice,
    "Reshape": _reshape,
    "Add": _elementwise(np.add, _INT),
    "Sub": _elementwise(np.subtract, _INT),
    "Mul": _elementwise(np.multiply, _INT),
    "Neg": _elementwise(np.negative, _INT),
    "Abs": _elementwise(np.abs, _INT),
    "Max": _elementwise(np.maximum, _INT),
    "Min": _elementwise(np.minimum, _INT),
    "Div": _div,
    "Mod": _mod,
    "Equal": _elementwise(np.equal, _INT_OR_BOOL),
    "Less": _elementwise(np.less, _INT),
    "LessOrEqual": _elementwise(np.less_equal, _INT),
    "Greater": _elementwise(np.greater, _INT),
    "GreaterOrEqual": _elementwise(np.greater_equal, _INT),
    "Not": _elementwise(np.logical_not, (np.bool_,)),
    "And": _elementwise(np.logical_and, (np.bool_,)),
    "Or": _elementwise(np.logical_or, (np.bool_,)),
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Expand": _expand,
    "Transpose": _transpose,
}
