"""Fix every graph input to the static shape the plan is made for.

The IPU compiles static shapes only, so a symbolic dim is never guessed: it comes from an explicit
``input_shapes`` entry (PopRT's ``--input_shape NAME=D0,D1,...``), a named ``dims`` value, or, for a
leading dim, ``batch_size``. What none of them covers is returned, so the caller can refuse the
model before planning and name each dim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import onnx

from sharderd.errors import ConfigError, ModelInvalidError

__all__ = ["InputDims", "UnresolvedDim", "fix_input_dims", "graph_inputs"]


@dataclass(frozen=True, slots=True)
class UnresolvedDim:
    """One symbolic input dim nothing gave a value."""

    input: str
    axis: int
    name: str
    """The dim's ``dim_param``; empty when the export left it anonymous."""
    template: str = ""
    """The input's shape with known dims filled in and ``<size>`` for open ones: ``1,<size>,16``."""

    def describe(self) -> str:
        label = f" ({self.name!r})" if self.name else " (anonymous)"
        return f"input {self.input!r} axis {self.axis}{label}"


@dataclass(frozen=True, slots=True)
class InputDims:
    shapes: Mapping[str, tuple[int, ...]]
    """Every graph input's static shape, as planned (empty tuple: a scalar)."""
    resolved: Mapping[str, int]
    """Symbolic dim names and the value each was given."""
    unresolved: tuple[UnresolvedDim, ...]


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: ir_version < 4 models also list their initializers as inputs."""
    initializers = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in initializers]


def fix_input_dims(
    graph: onnx.GraphProto,
    *,
    batch_size: int,
    dims: Mapping[str, int],
    input_shapes: Mapping[str, tuple[int, ...]],
    only: Collection[str] | None = None,
) -> InputDims:
    """Write static dims into ``graph``'s inputs (a copy's, never the user's model) and say which stay open.

    Precedence: ``input_shapes`` (whole shapes, checked against the model's static dims), then
    ``dims`` by name, then ``batch_size`` for a leading dim. A name resolved once applies to every
    axis with that name. ``only`` restricts the work to the user's real inputs (an inference copy
    also has its weights as inputs).
    """
    inputs = [v for v in graph_inputs(graph) if only is None or v.name in only]
    by_name = {v.name: v for v in inputs}
    unknown = sorted(set(input_shapes) - set(by_name))
    if unknown:
        raise ConfigError(
            f"input shape given for {', '.join(map(repr, unknown))}, which the model does not have as an input; "
            f"its inputs are {', '.join(repr(n) for n in by_name) or 'none'}"
        )
    named: dict[str, int] = dict(dims)
    from_shapes: dict[str, tuple[int, str]] = {}
    for name, shape in input_shapes.items():
        dims_proto = _dims(by_name[name])
        if dims_proto is not None and len(dims_proto) != len(shape):
            raise ConfigError(
                f"input shape for {name!r} has {len(shape)} dims {list(shape)}, but the model's input has rank {len(dims_proto)} "
                f"({_show(dims_proto)})"
            )
        for axis, size in enumerate(shape):
            if size < 1:
                raise ConfigError(
                    f"input shape for {name!r}: dim {axis} = {size}; dims must be >= 1"
                )
            dim = dims_proto[axis] if dims_proto is not None else None
            if dim is not None and _fixed(dim) and dim.dim_value != size:
                raise ConfigError(
                    f"input shape for {name!r} gives dim {axis} = {size}, but the model fixes it to {dim.dim_value}"
                )
            param = _param(dim) if dim is not None and not _fixed(dim) else ""
            if not param:
                continue
            if param in dims and dims[param] != size:
                raise ConfigError(
                    f"dim {param!r} is {dims[param]} from dims but {size} from the input shape of {name!r}"
                )
            seen = from_shapes.get(param)
            if seen is not None and seen[0] != size:
                raise ConfigError(
                    f"dim {param!r} is {seen[0]} in the input shape of {seen[1]!r} but {size} in that of {name!r}"
                )
            from_shapes[param] = (size, name)
            named[param] = size
    for value in inputs:
        dims_proto = _dims(value)
        if dims_proto and value.name not in input_shapes:
            first = dims_proto[0]
            if not _fixed(first) and _param(first):
                named.setdefault(_param(first), batch_size)

    shapes: dict[str, tuple[int, ...]] = {}
    resolved: dict[str, int] = {}
    unresolved: list[UnresolvedDim] = []
    for value in inputs:
        if not value.type.HasField("tensor_type"):
            continue
        dims_proto = _dims(value)
        if dims_proto is None:
            if value.name in input_shapes:
                _set_shape(value, input_shapes[value.name])
                shapes[value.name] = tuple(input_shapes[value.name])
            else:
                unresolved.append(UnresolvedDim(value.name, -1, ""))
            continue
        fixed: list[int] = []
        for axis, dim in enumerate(dims_proto):
            if _fixed(dim):
                if dim.dim_value <= 0:
                    raise ModelInvalidError(
                        f"graph input {value.name!r} has dim {axis} = {dim.dim_value}; dims must be >= 1"
                    )
                fixed.append(dim.dim_value)
                continue
            param = _param(dim)
            if value.name in input_shapes:
                size = input_shapes[value.name][axis]
            elif param and param in named:
                size = named[param]
            elif axis == 0:
                size = batch_size
            else:
                unresolved.append(
                    UnresolvedDim(value.name, axis, param, _template(dims_proto, named, batch_size))
                )
                continue
            if param:
                resolved[param] = size
            dim.dim_value = size  # clears dim_param: it is a oneof
            fixed.append(size)
        if len(fixed) == len(dims_proto):
            shapes[value.name] = tuple(fixed)
    for tensor in graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise ModelInvalidError(
                f"initializer {tensor.name!r} has a negative dim {list(tensor.dims)}"
            )
    return InputDims(shapes, resolved, tuple(unresolved))


def _fixed(dim) -> bool:
    """A static dim. Paddle exports write -1 for a dynamic one: that is open, like a ``dim_param``."""
    return dim.HasField("dim_value") and dim.dim_value != -1


def _param(dim) -> str:
    """The dim's name; exporters that write ``?`` for every open dim (Paddle) name none of them."""
    return "" if dim.dim_param in ("?", "-1") else dim.dim_param


def _template(dims_proto, named: Mapping[str, int], batch_size: int) -> str:
    parts = []
    for axis, dim in enumerate(dims_proto):
        if _fixed(dim):
            parts.append(str(dim.dim_value))
        elif _param(dim) in named:
            parts.append(str(named[_param(dim)]))
        elif axis == 0:
            parts.append(str(batch_size))
        else:
            parts.append("<size>")
    return ",".join(parts)


def _dims(value: onnx.ValueInfoProto):  # -> RepeatedCompositeFieldContainer | None
    tensor_type = value.type.tensor_type
    return tensor_type.shape.dim if tensor_type.HasField("shape") else None


def _set_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    proto = value.type.tensor_type.shape
    proto.ClearField("dim")
    for size in shape:
        proto.dim.add().dim_value = size


def _show(dims_proto) -> str:
    return (
        "["
        + ", ".join(str(d.dim_value) if _fixed(d) else (d.dim_param or "?") for d in dims_proto)
        + "]"
    )
