"""Exact shapes of every tensor of a model, measured by running it once in onnxruntime.

Independent of sharderd's shape inference: every node output is made a graph output, the model runs
on generated inputs, and each result's shape is read off. ``If`` bodies run too: the branch the
condition took is cut out as a model of its own, its outer-scope values fed from the first run, so
the tensors inside it get exact shapes as well (the branch not taken has none). ``Loop``/``Scan``
bodies are not entered. Used by ``test_real_exports.py``; ``bench/export_models.py`` feeds the same
inputs when it records a model's ORT output shapes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

from sharderd.graph.flops import node_flops

__all__ = [
    "Oracle",
    "constant_outputs",
    "exact_flops",
    "make_inputs",
    "run_oracle",
    "safe_index_bound",
]

_MAX_INDEX = 1 << 16


@dataclass(frozen=True, slots=True)
class Oracle:
    shapes: Mapping[str, tuple[int, ...]]
    """Every tensor that existed in the run (inputs, weights, node outputs, taken If branches)."""
    nodes: tuple[onnx.NodeProto, ...]
    """Every node that ran: the top level and the bodies of the If branches taken."""


def safe_index_bound(model: onnx.ModelProto) -> int:
    """The smallest first dim of any Gather's data initializer: ids below it are valid for every table."""
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
    bound = _MAX_INDEX
    for node in _all_nodes(model.graph):
        if (
            node.op_type == "Gather"
            and node.input
            and node.input[0] in dims
            and dims[node.input[0]]
        ):
            bound = min(bound, dims[node.input[0]][0])
    return max(bound, 1)


def make_inputs(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]],
    *,
    values: Mapping[str, Any] | None = None,
    ranges: Mapping[str, Sequence[float]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Inputs at ``shapes``: masks of ones, other ints in ``[0, safe_index_bound)``, floats in [0, 1).

    ``values`` fixes an input to a value (a sample rate), ``ranges`` gives [low, high) for floats.
    """
    rng = np.random.default_rng(seed)
    values, ranges = values or {}, ranges or {}
    initializers = {t.name for t in model.graph.initializer}
    bound = safe_index_bound(model)
    feed: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = tuple(shapes[value.name])
        if value.name in values:
            feed[value.name] = np.full(shape, values[value.name], dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            low, high = ranges.get(value.name, (0.0, 1.0))
            feed[value.name] = rng.uniform(low, high, shape).astype(dtype)
        elif dtype == np.bool_ or "mask" in value.name:
            feed[value.name] = np.ones(shape, dtype=dtype)
        else:
            feed[value.name] = rng.integers(0, bound, shape).astype(dtype)
    return feed


def run_oracle(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> Oracle:
    """Run ``model`` (weights loaded) once on ``feed`` and return every tensor's exact shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    nodes: list[onnx.NodeProto] = []
    _run_graph(model, model.graph, dict(feed), shapes, nodes)
    return Oracle(shapes, tuple(nodes))


def exact_flops(oracle: Oracle, folded: Collection[str] = ()) -> float:
    """FLOPs of the run by sharderd's per-op formulas applied to the measured shapes, without the
    nodes whose first output is in ``folded`` (constant expressions: ``constant_outputs``)."""
    total = 0.0
    for node in oracle.nodes:
        if node.output and node.output[0] in folded:
            continue
        ins = [oracle.shapes.get(name) if name else None for name in node.input]
        outs = [oracle.shapes.get(name) if name else None for name in node.output]
        total += node_flops(node, ins, outs).flops
    return total


_NOT_CONSTANT = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
    | {"Bernoulli", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty"}
)


def constant_outputs(model: onnx.ModelProto, static: Collection[str]) -> list[str]:
    """The first output of each top-level node computable at compile time, given the tensors
    whose shapes are ``static``: every input it names is an initializer or a constant's output, or
    it is Shape/Size of a static tensor. Written from the ONNX graph alone, independently of
    sharderd's folding (nodes in file order, which exporters write topologically)."""
    graph = model.graph
    inputs = {i.name for i in graph.input}
    constant = {t.name for t in graph.initializer if t.name not in inputs}
    found = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_CONSTANT:
            continue
        named = [name for name in node.input if name]
        if node.op_type in ("Shape", "Size"):
            is_constant = bool(named) and named[0] in static
        else:
            is_constant = all(name in constant for name in named)
        if is_constant:
            constant.update(node.output)
            found.append(node.output[0])
    return found


def _run_graph(
    model: onnx.ModelProto,
    graph: onnx.GraphProto,
    feed: dict[str, np.ndarray],
    shapes: dict[str, tuple[int, ...]],
    nodes: list[onnx.NodeProto],
) -> None:
    values = _run_exposed(model, graph, feed)
    for name, array in feed.items():
        shapes[name] = tuple(array.shape)
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
        values.setdefault(tensor.name, onnx.numpy_helper.to_array(tensor))
    for name, array in values.items():
        shapes[name] = tuple(array.shape)
    nodes.extend(graph.node)
    for node in graph.node:
        if node.op_type != "If":
            continue
        cond = bool(np.asarray(values[node.input[0]]).reshape(()))
        branch = next(
            a.g for a in node.attribute if a.name == ("then_branch" if cond else "else_branch")
        )
        known = values | feed
        outer = {name: known[name] for name in _free_names(branch) if name in known}
        _run_graph(model, branch, outer, shapes, nodes)


def _run_exposed(
    model: onnx.ModelProto, graph: onnx.GraphProto, feed: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """Run ``graph`` as a model with every node output as a graph output; results by name."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.CopyFrom(graph)
    del exposed.graph.input[:]
    for name, array in feed.items():
        exposed.graph.input.append(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
            )
        )
    produced = [name for node in graph.node for name in node.output if name]
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in dict.fromkeys(produced))
    del exposed.graph.value_info[:]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        exposed.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    results = session.run(
        names, {k: v for k, v in feed.items() if k in {i.name for i in session.get_inputs()}}
    )
    return {
        name: np.asarray(r)
        for name, r in zip(names, results, strict=True)
        if isinstance(r, np.ndarray)
    }


def _free_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` (and its own bodies) read from an enclosing scope."""
    defined = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    free: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                free[name] = None
        for attr in node.attribute:
            for sub in _bodies(attr):
                for name in _free_names(sub):
                    if name not in defined:
                        free[name] = None
        defined.update(node.output)
    return list(free)


def _bodies(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    return list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in _bodies(attr):
                yield from _all_nodes(sub)
