"""Seeded inputs for a model, in range for what reads them.

Random int64 token ids would index past the embedding and fail the run (or, worse, read
garbage on a provider without bounds checks), so integers that reach a Gather as indices stay
below the dim they index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from sharderd.errors import ModelInvalidError
from sharderd.shard.split import infer_value_infos

__all__ = ["index_bounds", "make_inputs"]

_PASS_THROUGH = frozenset(
    {
        "Identity",
        "Cast",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Expand",
        "Transpose",
        "Tile",
    }
)
"""Ops that carry index values through unchanged, between a graph input and a Gather."""
_SMALL_INT = 4
"""Integer inputs that index nothing get values in [0, 4): small, valid as counts or ids."""


def make_inputs(
    model: onnx.ModelProto,
    *,
    batch_size: int,
    dims: Mapping[str, int],
    seed: int,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded values for every graph input, in range for what reads them.

    Integers that index a Gather stay below the indexed dim (token ids below the vocabulary);
    inputs named like ``*mask*`` are 0/1; other integers are small and non-negative; floats are
    normal with standard deviation 0.5.
    """
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    bounds = index_bounds(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        if not value.type.HasField("tensor_type"):
            raise ModelInvalidError(
                f"graph input {value.name!r} is not a tensor; cannot generate values for it"
            )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        planned = (input_shapes or {}).get(value.name)
        shape = tuple(planned) if planned is not None else _input_shape(value, batch_size, dims)
        if "mask" in value.name.lower() and dtype.kind in "biuf":
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(
                0, max(bounds.get(value.name, _SMALL_INT), 1), shape
            ).astype(dtype)
        elif dtype.kind == "f":
            feeds[value.name] = (rng.standard_normal(shape) * 0.5).astype(dtype)
        else:
            raise ModelInvalidError(
                f"graph input {value.name!r} has type {dtype}; cannot generate values for it"
            )
    return feeds


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input → exclusive upper bound for its values, for inputs that end up as Gather indices.

    Follows each input through ops that keep values (Identity, Cast, Reshape...) to every Gather
    that uses it as indices, and takes the smallest indexed dim.
    """
    graph = model.graph
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((node, k))
    shapes: dict[str, list[int]] = {t.name: list(t.dims) for t in graph.initializer}
    inferred: dict[str, onnx.ValueInfoProto] | None = None
    bounds: dict[str, int] = {}
    for value in graph.input:
        stack, seen = [value.name], {value.name}
        while stack:
            for node, k in readers.get(stack.pop(), ()):
                if node.op_type in _PASS_THROUGH and k == 0:
                    fresh = [o for o in node.output if o and o not in seen]
                    seen.update(fresh)
                    stack.extend(fresh)
                elif node.op_type == "Gather" and k == 1:
                    data = node.input[0]
                    if data not in shapes:
                        inferred = infer_value_infos(model) if inferred is None else inferred
                        shapes[data] = _static_dims(inferred.get(data))
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    dims = shapes[data]
                    if -len(dims) <= axis < len(dims) and dims[axis] > 0:
                        bounds[value.name] = min(bounds.get(value.name, dims[axis]), dims[axis])
    return bounds


def _input_shape(
    value: onnx.ValueInfoProto, batch_size: int, dims: Mapping[str, int]
) -> tuple[int, ...]:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise ModelInvalidError(
            f"graph input {value.name!r} has no shape; cannot generate values for it"
        )
    shape = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
        elif dim.dim_param in dims:
            shape.append(dims[dim.dim_param])
        elif axis == 0:
            shape.append(batch_size)
        else:
            label = repr(dim.dim_param) if dim.dim_param else "unnamed"
            raise ModelInvalidError(
                f"graph input {value.name!r}: dim {axis} ({label}) is symbolic",
                hint="give it a value with --dim NAME=N or --input-shape (plan.dims, plan.input_shapes)",
            )
    return tuple(shape)


def _static_dims(value: onnx.ValueInfoProto | None) -> list[int]:
    if value is None or not value.type.tensor_type.HasField("shape"):
        return []
    return [
        d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim
    ]
