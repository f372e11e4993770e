"""Write the plan into the model as PopART reads it: INT attributes ``__ipu_number`` and
``__pipeline_stage`` on every node (bodies of If/Loop/Scan inherit their node's values).

The one structural change: a graph input read on several stages is routed through an
``Identity`` on its first stage, because PopART streams an input onto a single IPU only
("For pipelining, stream tensors can only be streamed directly onto a single IPU").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from sharderd.graph.dataflow import Dataflow

__all__ = [
    "IPU_ATTR",
    "STAGE_ATTR",
    "RoutedInput",
    "annotate",
    "bodies",
    "check_annotation",
    "read_annotation",
    "replace_attributes",
]

IPU_ATTR = "__ipu_number"
STAGE_ATTR = "__pipeline_stage"


@dataclass(frozen=True, slots=True)
class RoutedInput:
    input: str
    stages: tuple[int, ...]
    """Stages that read it."""
    node: str
    """The Identity node added on the first of them."""
    output: str


def replace_attributes(node: onnx.NodeProto, *attrs: onnx.AttributeProto) -> None:
    """Give ``node`` ``attrs``, dropping any it had of the same names (the others keep their order)."""
    names = {a.name for a in attrs}
    kept = [a for a in node.attribute if a.name not in names]
    del node.attribute[:]
    node.attribute.extend([*kept, *attrs])


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    replace_attributes(node, onnx.helper.make_attribute(name, int(value)))


def bodies(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The subgraphs of ``node`` (the branches of an If, the body of a Loop or Scan)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _annotate_node(node: onnx.NodeProto, stage: int) -> None:
    _set_int(node, IPU_ATTR, stage)
    _set_int(node, STAGE_ATTR, stage)
    for body in bodies(node):
        for inner in body.node:
            _annotate_node(inner, stage)


def _rename_reads(node: onnx.NodeProto, old: str, new: str) -> None:
    for k, name in enumerate(node.input):
        if name == old:
            node.input[k] = new
    for body in bodies(node):
        for inner in body.node:
            _rename_reads(inner, old, new)


def _unique(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def annotate(
    model: onnx.ModelProto, flow: Dataflow, assignment: np.ndarray
) -> tuple[RoutedInput, ...]:
    """Annotate ``model`` in place with one device per stage; ``assignment[node]`` is its stage.

    ``flow`` must describe ``model.graph`` as it is now (the node list is not reordered).
    """
    graph = model.graph
    nodes = list(graph.node)
    for node, stage in zip(nodes, assignment.tolist(), strict=True):
        _annotate_node(node, stage)
    taken_nodes = {n.name for n in nodes}
    taken_tensors = set(flow.tensor_names) | {t.name for t in graph.initializer}
    routed: list[RoutedInput] = []
    new_nodes: list[onnx.NodeProto] = []
    for t, name in enumerate(flow.tensor_names):
        if flow.producer[t] >= 0:
            continue
        readers = flow.consumers(t)
        stages = sorted({int(assignment[c]) for c in readers.tolist()})
        if len(stages) < 2:
            continue
        first = stages[0]
        out = _unique(f"{name}__sharderd_routed", taken_tensors)
        node = onnx.helper.make_node(
            "Identity", [name], [out], name=_unique(f"sharderd/route/{name}", taken_nodes)
        )
        _annotate_node(node, first)
        new_nodes.append(node)
        for c in readers.tolist():
            if int(assignment[c]) != first:
                _rename_reads(nodes[c], name, out)
        routed.append(RoutedInput(name, tuple(stages), node.name, out))
    if new_nodes:
        # An Identity reads only a graph input, so placing it first keeps the list topological.
        for node in reversed(new_nodes):
            graph.node.insert(0, node)
    return tuple(routed)


def read_annotation(model: onnx.ModelProto) -> dict[str, tuple[int | None, int | None]]:
    """Node name → (``__ipu_number``, ``__pipeline_stage``) for every top-level node."""
    out = {}
    for node in model.graph.node:
        values: dict[str, int | None] = {IPU_ATTR: None, STAGE_ATTR: None}
        for attr in node.attribute:
            if attr.name in values and attr.type == onnx.AttributeProto.INT:
                values[attr.name] = attr.i
        out[node.name] = (values[IPU_ATTR], values[STAGE_ATTR])
    return out


def check_annotation(model: onnx.ModelProto) -> list[str]:
    """PopART's rules for a manually sharded, pipelined model; returns the violations found."""
    problems: list[str] = []
    graph = model.graph
    stage_of: dict[str, int] = {}
    producer_stage: dict[str, int] = {}
    for node in graph.node:
        values = {a.name: a for a in node.attribute if a.name in (IPU_ATTR, STAGE_ATTR)}
        if len(values) < 2 or any(a.type != onnx.AttributeProto.INT for a in values.values()):
            problems.append(f"node {node.name!r} lacks INT {IPU_ATTR}/{STAGE_ATTR}")
            continue
        ipu, stage = values[IPU_ATTR].i, values[STAGE_ATTR].i
        if ipu != stage:
            problems.append(
                f"node {node.name!r}: stage {stage} on device {ipu} (one device per stage)"
            )
        stage_of[node.name] = stage
        for body in bodies(node):
            for inner in _walk(body):
                inner_stage = {
                    a.name: a.i for a in inner.attribute if a.name in (IPU_ATTR, STAGE_ATTR)
                }
                if inner_stage.get(STAGE_ATTR) != stage or inner_stage.get(IPU_ATTR) != ipu:
                    problems.append(f"node {inner.name!r} inside {node.name!r} is not on its stage")
        for out in node.output:
            producer_stage[out] = stage
    stages = sorted(set(stage_of.values()))
    if stages and stages != list(range(len(stages))):
        problems.append(f"stages are not 0..{len(stages) - 1} without gaps: {stages}")
    input_stages: dict[str, set[int]] = {i.name: set() for i in graph.input}
    for node in graph.node:
        stage = stage_of.get(node.name)
        if stage is None:
            continue
        for name in _reads(node):
            if name in producer_stage and producer_stage[name] > stage:
                problems.append(
                    f"edge {name!r} goes back from stage {producer_stage[name]} to stage {stage} ({node.name!r})"
                )
            if name in input_stages:
                input_stages[name].add(stage)
    initializers = {t.name for t in graph.initializer}
    for name, used in input_stages.items():
        if len(used) > 1 and name not in initializers:
            problems.append(f"graph input {name!r} is read on several devices {sorted(used)}")
    return problems


def _walk(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for body in bodies(node):
            yield from _walk(body)


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    yield from (x for x in node.input if x)
    for body in bodies(node):
        for inner in _walk(body):
            yield from (x for x in inner.input if x)
