"""Static shapes for every tensor: inputs fixed to the planned shapes, then sizes settled.

Inference runs on a copy of the graph whose weights are typed inputs (``propagate.inference_copy``),
so a model with 1.9 GB of inline weights is neither serialised twice nor read. ONNX's inference and
the constant expressions' values are driven to a fixed point (graph/fixed_point.py); only what that
leaves unknown goes to onnxruntime's symbolic inference (graph/symbolic.py, with sympy), which
bounds sizes that depend on the data. Where a size stays unknown, ``stops`` names the node that
stops it and why (graph/shape_stops.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from sharderd.graph.evaluate import with_values
from sharderd.graph.fixed_point import settle_shapes
from sharderd.graph.input_dims import UnresolvedDim, fix_input_dims, graph_inputs
from sharderd.graph.propagate import (
    DataDependentShape,
    TensorType,
    inference_copy,
    propagate_shapes,
)
from sharderd.graph.shape_stops import ShapeStop, shape_stops

__all__ = [
    "DataDependentShape",
    "ShapeInfo",
    "ShapeStop",
    "TensorType",
    "UnresolvedDim",
    "shape_info",
]

FIXED_POINT = "onnx+constants"
"""``ShapeInfo.engine`` when ONNX's inference and the constants' values sized every tensor."""


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    types: Mapping[str, TensorType]
    input_shapes: Mapping[str, tuple[int, ...]]
    """Every graph input's static shape as planned: what the sharded model is written with."""
    resolved_dims: Mapping[str, int]
    """Symbolic dims of graph inputs and the values they were given."""
    unresolved: tuple[UnresolvedDim, ...]
    """Symbolic input dims nothing gave a value (the caller refuses to plan)."""
    engine: str
    """What sized the tensors: ``onnx+constants`` (the fixed point), followed by
    ``+onnxruntime-symbolic`` (or ``+onnx``, its fallback) when it left tensors unknown."""
    inference_error: str | None
    data_dependent: tuple[DataDependentShape, ...]
    notes: tuple[str, ...]
    rounds: int = 0
    """Rounds the fixed point took (``fixed_point.MAX_ROUNDS`` at most)."""
    stops: tuple[ShapeStop, ...] = ()
    """Where sizes stay unknown: the node that stops each, and why."""

    @property
    def unresolved_dims(self) -> tuple[str, ...]:
        return tuple(d.describe() for d in self.unresolved)


def shape_info(
    model: onnx.ModelProto,
    *,
    batch_size: int,
    dims: Mapping[str, int],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    order: Sequence[int] | None = None,
) -> ShapeInfo:
    """Shapes of every tensor at the planned input shapes; ``model`` is left untouched. ``order``
    is a topological order of its nodes (default: the file's).

    With dims left open, nothing is inferred: planning on unknown sizes is what this prevents.
    """
    light = inference_copy(model)
    real = {v.name for v in graph_inputs(model.graph)}
    fixed = fix_input_dims(
        light.graph, batch_size=batch_size, dims=dims, input_shapes=input_shapes or {}, only=real
    )
    if fixed.unresolved:
        return ShapeInfo({}, fixed.shapes, fixed.resolved, fixed.unresolved, "none", None, (), ())
    order = range(len(light.graph.node)) if order is None else order
    settled = settle_shapes(light, order)
    types, engine, error = settled.types, FIXED_POINT, None
    data_dependent: tuple[DataDependentShape, ...] = ()
    notes: tuple[str, ...] = ()
    if settled.unknown:
        symbolic = propagate_shapes(with_values(light, settled.values))
        types = {**types}
        for name, tt in symbolic.types.items():
            if tt.shape is not None and (name not in types or types[name].shape is None):
                types[name] = tt
        engine, error = f"{FIXED_POINT}+{symbolic.engine}", symbolic.error
        data_dependent, notes = symbolic.data_dependent, symbolic.notes
    constants = {*settled.values, *(t.name for t in light.graph.initializer)}
    return ShapeInfo(
        types,
        fixed.shapes,
        fixed.resolved,
        (),
        engine,
        error,
        data_dependent,
        notes,
        settled.rounds,
        shape_stops(light.graph, order, types, constants),
    )
