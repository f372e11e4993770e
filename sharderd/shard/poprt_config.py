"""The PopRT ``--manual_sharding_config`` YAML equivalent of a plan.

PopRT's Sharder assigns each listed node and its unassigned ancestors to the node's device and
stage. Listing every node in topological order makes that reproduce the plan exactly, whatever
order PopRT sorts the points in. Names are written as JSON strings, which YAML reads verbatim.
A stage's own ``available_memory_proportion`` has no key in PopRT's YAML (``node``, ``device``,
``stage`` only): it is in the sharded model as ``__available_memory`` on that stage's conv/matmul
nodes, and the YAML's header says which stages have one.
"""

from __future__ import annotations

import json

import onnx

from sharderd.shard.amp import AMP_ATTR, stage_amps_of
from sharderd.shard.annotate import read_annotation

__all__ = ["manual_sharding_yaml"]


def manual_sharding_yaml(model: onnx.ModelProto) -> str:
    """A YAML list of ``{node, device, stage}`` for every top-level node of an annotated model."""
    lines = ["# sharderd: PopRT --manual_sharding_config for the annotated model"]
    for index, amp in sorted(stage_amps_of(model.graph).items()):
        lines.append(
            f"# stage {index}: available_memory_proportion {amp:g} on its conv/matmul nodes "
            f"({AMP_ATTR} in the sharded model)"
        )
    lines.append("")
    for name, (device, stage) in read_annotation(model).items():
        lines.append(f"- node: {json.dumps(name, ensure_ascii=False)}")
        lines.append(f"  device: {device}")
        lines.append(f"  stage: {stage}")
    return "\n".join(lines) + "\n"
