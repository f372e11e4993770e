"""Which node to compile alone on one device (docs/search.md, "The probe"): an overflow there
proves that no split fits, whatever the number of devices."""

from __future__ import annotations

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.plan.matmul_serial import serial_factor
from sharderd.plan.observations import StageView
from sharderd.plan.op_costs import node_code_bytes
from sharderd.target import Target

__all__ = ["PROBE_MIN_NEED", "probe_factor", "probe_target"]

PROBE_MIN_NEED = 0.5
"""Probe a node only when the model says it needs at least this share of a device alone. The probe
takes a compile slot; a node below half a device overflows alone only if the compiler more than
doubles its bytes, an error no per-op term of the model allows, and such a node still leaves room
for a neighbour on every device, so a plan's own compile is the better test of it."""


def probe_target(analysis: Analysis, target: Target) -> tuple[str, StageView] | None:
    """The node needing the largest share of a device alone (weights, inputs, outputs, code), if
    at least ``PROBE_MIN_NEED``, as a one-node stage. From the model as planned: corrections spread
    a stage's factor over all its nodes, which says nothing about which is the heavy one."""
    capacity = target.memory_bytes
    floor = memory_floor(analysis, target).node_bytes
    need = floor / capacity
    node = int(np.argmax(need)) if len(need) else -1
    if node < 0 or not need[node] >= PROBE_MIN_NEED:
        return None
    raw = float(floor[node])
    code_share = min(1.0, float(node_code_bytes(analysis, target)[node]) / max(raw, 1.0))
    view = StageView(0, raw / capacity, ((node, node + 1),), code_share)
    return analysis.flow.node_names[node], view


def probe_factor(analysis: Analysis, node: int) -> int:
    """The matmul serialization factor a probe of node ``node`` (file index) is retried with when
    it overflows (``plan.matmul_serial.serial_factor``; 0: none)."""
    proto = analysis.model.graph.node[node]
    known = analysis.shapes.types.get(proto.output[0]) if proto.output else None
    return serial_factor(proto.op_type, None if known is None else known.shape)
