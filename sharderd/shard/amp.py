"""AMP per stage as PopART reads it: the FLOAT node attribute ``__available_memory``.

PopART's session-wide ``available_memory_proportion`` caps the temporary memory per tile that the
conv/matmul planner may plan for (floor(amp × tile bytes)); the node attribute is the same cap for
one conv/matmul op (poprt-facts.md, PopART attribute names). sharderd sets it on every
conv/matmul/Gemm node of a stage whose compile ran out of memory and that a lower cap can help,
so the other stages keep the faster default; nodes of other op types never carry it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import onnx

from sharderd.shard.annotate import STAGE_ATTR, bodies, replace_attributes

__all__ = [
    "AMP_ATTR",
    "AMP_OPS",
    "amps_by_stage",
    "node_amps",
    "set_amp",
    "set_stage_amps",
    "stage_amps_of",
    "walk_nodes",
]

AMP_ATTR = "__available_memory"
AMP_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
"""The ops PopART plans with the conv/matmul planner (a Gemm is lowered to a matmul)."""


def walk_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph``, then of the bodies of its If/Loop/Scan nodes, depth first."""
    for node in graph.node:
        yield node
        for body in bodies(node):
            yield from walk_nodes(body)


def _stage(node: onnx.NodeProto) -> int | None:
    return next(
        (a.i for a in node.attribute if a.name == STAGE_ATTR and a.type == a.INT),
        None,
    )


def set_amp(node: onnx.NodeProto, amp: float) -> None:
    """Give ``node`` the FLOAT ``__available_memory`` ``amp`` (replacing any it had)."""
    replace_attributes(node, onnx.helper.make_attribute(AMP_ATTR, float(amp)))


def set_stage_amps(model: onnx.ModelProto, amps: Sequence[float | None]) -> int:
    """Set ``amps[s]`` on every conv/matmul/Gemm node of stage ``s`` (bodies of If/Loop/Scan
    included: they carry their node's stage); None leaves a stage at the session's option.
    Returns how many nodes were set."""
    count = 0
    for node in walk_nodes(model.graph):
        stage = _stage(node)
        if node.op_type not in AMP_OPS or stage is None or stage >= len(amps):
            continue
        amp = amps[stage]
        if amp is not None:
            set_amp(node, amp)
            count += 1
    return count


def node_amps(graph: onnx.GraphProto) -> dict[str, float]:
    """Node name → its ``__available_memory``, for every top-level node that has one."""
    return {
        node.name: float(a.f)
        for node in graph.node
        for a in node.attribute
        if a.name == AMP_ATTR and a.type == onnx.AttributeProto.FLOAT
    }


def stage_amps_of(graph: onnx.GraphProto) -> dict[int, float]:
    """Stage → the ``__available_memory`` its conv/matmul nodes carry (the lowest if several)."""
    out: dict[int, float] = {}
    amps = node_amps(graph)
    for node in graph.node:
        stage = _stage(node)
        if node.name in amps and stage is not None:
            out[stage] = min(out.get(stage, amps[node.name]), amps[node.name])
    return out


def amps_by_stage(
    planned: Mapping[str, Mapping[str, int]], amps: Mapping[str, float]
) -> dict[int, float]:
    """Stage → AMP from node-name maps (``planned``: name → its stage attributes)."""
    out: dict[int, float] = {}
    for name, amp in amps.items():
        stage = planned.get(name, {}).get(STAGE_ATTR)
        if stage is not None:
            out[stage] = min(out.get(stage, amp), amp)
    return out
