"""Put a plan back on a model a converter rebuilt: by node name, as PopRT's manual sharding does.

PopRT converts a model (precision, ``int64_to_int32``, fusions) before it compiles it and applies
manual sharding afterwards, by node name. A node that kept its name gets its planned stage again;
a node the conversion added (a Cast after an input, a fused node under a new name) takes the
stage of the nodes it reads from, or of its readers when it reads only graph inputs; a planned
node that is gone was fused away or removed. ``Reannotation`` says how many of each. A per-op
``__available_memory`` (``shard.amp``) goes back the same way: by name, and a conv/matmul the
conversion added takes its stage's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import onnx

from sharderd.shard.amp import AMP_OPS, amps_by_stage, set_amp
from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR

__all__ = ["Reannotation", "reapply_annotation"]


@dataclass(frozen=True, slots=True)
class Reannotation:
    kept: int
    """Planned nodes found by name, given their stage again."""
    added: tuple[str, ...]
    """Nodes the conversion added, placed by their neighbours."""
    removed: tuple[str, ...]
    """Planned nodes no longer in the model (fused or removed)."""

    def describe(self, precision: str) -> str:
        text = f"precision {precision}, int64_to_int32: {self.kept} node(s) re-annotated by name"
        if self.added:
            text += f", {len(self.added)} added ({', '.join(self.added[:3])}{', …' if len(self.added) > 3 else ''})"
        if self.removed:
            text += f", {len(self.removed)} gone ({', '.join(self.removed[:3])}{', …' if len(self.removed) > 3 else ''})"
        return text


def reapply_annotation(
    model: onnx.ModelProto,
    planned: Mapping[str, Mapping[str, int]],
    original: Collection[str],
    amps: Mapping[str, float] | None = None,
) -> Reannotation:
    """Annotate ``model`` in place from ``planned`` (node name → its ``__ipu_number`` /
    ``__pipeline_stage`` values, whichever it had). ``original`` names every node the model had
    before conversion: one of those without an annotation stays without (the compiler reports a
    mixed annotation itself); only nodes the conversion added are placed by their neighbours.
    ``amps`` (node name → ``__available_memory``) is put back on the nodes of those names; a
    conv/matmul the conversion added gets the AMP its stage's nodes had, if any."""
    nodes = list(model.graph.node)
    placed: dict[str, Mapping[str, int]] = {}
    producer: dict[str, int] = {}
    kept = 0
    for i, node in enumerate(nodes):
        if node.name in planned:
            placed[node.name] = planned[node.name]
            kept += 1
        for out in node.output:
            producer[out] = i
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    added = [node for node in nodes if node.name not in original]
    for _ in range(len(added) + 1):  # new nodes may feed each other: settle in a few sweeps
        pending = []
        for node in added:
            inputs = [nodes[producer[x]].name for x in node.input if x in producer]
            outputs = [nodes[r].name for o in node.output for r in readers.get(o, [])]
            before = [placed[n] for n in inputs if n in placed]
            after = [placed[n] for n in outputs if n in placed]
            if len(before) < len(inputs) or (not inputs and len(after) < len(outputs)):
                pending.append(node)
                continue
            if before:
                placed[node.name] = max(before, key=_position)
            elif after:
                placed[node.name] = min(after, key=_position)
            else:
                placed[node.name] = {}
        if len(pending) == len(added):
            break
        added = pending
    for node in nodes:
        values = placed.get(node.name, {})
        attrs = [a for a in node.attribute if a.name not in (IPU_ATTR, STAGE_ATTR)]
        attrs += [onnx.helper.make_attribute(k, int(v)) for k, v in sorted(values.items())]
        del node.attribute[:]
        node.attribute.extend(attrs)
    _reapply_amps(nodes, placed, original, amps or {}, amps_by_stage(planned, amps or {}))
    names = {node.name for node in nodes}
    return Reannotation(
        kept,
        tuple(n.name for n in nodes if n.name not in original),
        tuple(name for name in planned if name not in names),
    )


def _reapply_amps(
    nodes: list[onnx.NodeProto],
    placed: Mapping[str, Mapping[str, int]],
    original: Collection[str],
    amps: Mapping[str, float],
    by_stage: Mapping[int, float],
) -> None:
    for node in nodes:
        if node.name in amps:
            set_amp(node, amps[node.name])
        elif node.name not in original and node.op_type in AMP_OPS:
            stage = placed.get(node.name, {}).get(STAGE_ATTR)
            if stage is not None and stage in by_stage:
                set_amp(node, by_stage[stage])


def _position(values: Mapping[str, int]) -> int:
    return values.get(STAGE_ATTR, values.get(IPU_ATTR, 0))
