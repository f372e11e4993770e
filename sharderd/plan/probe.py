"""Which node to compile alone on one device: the one whose fit decides "any number of devices".

A whole-model compile names one overflowing device, the lowest-numbered; a node that is too large
on its own is only seen once a plan puts it on the first device to fail, and until then a
"no number of devices helps" would be a guess from other nodes' factors. Compiled alone (its
inputs fed from the host, its weights on the device), the node's own worst tile is a measurement:
an overflow settles the verdict for every split, a fit says the node fits alone. The probe is
cheap (one op) and runs in a free pool slot beside the first plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.plan.op_costs import node_code_bytes
from sharderd.target import Target

__all__ = ["PROBE_MIN_NEED", "ProbeTarget", "probe_target"]

PROBE_MIN_NEED = 0.5
"""Probe a node only when the model says it needs at least this share of a device alone. The probe
takes a compile slot; a node below half a device overflows alone only if the compiler more than
doubles its bytes, an error no per-op term of the model allows, and such a node still leaves room
for a neighbour on every device, so a plan's own compile is the better test of it."""


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    node: int
    """File index of the node."""
    name: str
    predicted: float
    """Its weights, inputs, outputs not computed in place and code / device capacity, uncorrected."""
    code_share: float


def probe_target(analysis: Analysis, target: Target) -> ProbeTarget | None:
    """The node needing the largest share of a device alone, if it needs at least
    ``PROBE_MIN_NEED``.

    From the model as planned, before any compile: later, the corrections spread one stage's
    measured factor over all its nodes, which says nothing about which of them is the heavy one.
    """
    capacity = target.memory_bytes
    floor = memory_floor(analysis, target).node_bytes
    need = floor / capacity
    node = int(np.argmax(need)) if len(need) else -1
    if node < 0 or not need[node] >= PROBE_MIN_NEED:
        return None
    raw = float(floor[node])
    return ProbeTarget(
        node=node,
        name=analysis.flow.node_names[node],
        predicted=raw / capacity,
        code_share=min(1.0, float(node_code_bytes(analysis, target)[node]) / max(raw, 1.0)),
    )
