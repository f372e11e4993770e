"""The probe: one node compiled alone on one device (docs/search.md, "The probe"), whose
overflow at the lowest AMP proves that no split fits, whatever the number of devices.

Which node (``probe_target``): the one the model says needs the largest share of a device alone,
when at least ``PROBE_MIN_NEED``. When its proof holds (``probe_proves``): the compiler's report
is of the tiles' memory, not of a host stream's buffer (the probe feeds the node's inputs from the
host, which no split does); and a MatMul was tried serialized.

PopART's own per-op matmul serialization: PopART reads two attributes on a MatMul (poprt-facts.md,
PopART attribute names): ``__serialize_matmul_mode`` and ``__serialize_matmul_factor``. It then
computes the op as that many pieces one after the other on its own IPU: the same weights on that
IPU, less temporary memory at a time. So a MatMul that ran out of memory alone on one device is no
proof of "does not fit" until it ran out serialized too. The rule is one retry, never a model of
what serializing saves: when the probe's node is a MatMul and its probe overflowed at the lowest
AMP, the probe is compiled once more with ``SERIAL_MODE`` and the largest factor ``serial_factor``
allows. An overflow there is the proof (grounds ``probe``, "even serialized ×k") only when the
compiled model itself carried the two attributes (the backend reads them back from what it
compiled: a converter that renamed the node or rewrote its op would have dropped them); a fit makes every
later attempt write that node with those two attributes, and what earlier compiles measured
without them is set aside (a different program). Gemm is left out: PopART lowers it to a MatMul by
a pattern, and whether the attribute survives that is not documented.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import StageView
from sharderd.plan.op_costs import node_code_bytes
from sharderd.plan.search_state import Attempt, Finished, SearchState, Started
from sharderd.target import Target

__all__ = [
    "MAX_SERIAL_FACTOR",
    "PROBE_MIN_NEED",
    "SERIAL_MODE",
    "SERIAL_OPS",
    "learned",
    "probe_factor",
    "probe_proves",
    "probe_target",
    "serial_factor",
    "serial_probe",
    "why_no_proof",
]

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
    it overflows (``serial_factor``; 0: none)."""
    proto = analysis.model.graph.node[node]
    known = analysis.shapes.types.get(proto.output[0]) if proto.output else None
    return serial_factor(proto.op_type, None if known is None else known.shape)


SERIAL_MODE = "output_channels"
"""Pieces over the output's last axis: each piece reads all of the input and a slice of the
weight's columns, so no piece needs a sum of partial results (``reducing_dim`` would)."""
MAX_SERIAL_FACTOR = 16
"""The most pieces sharderd asks PopART for, so the factor of the one serialized probe: its
overflow proves the node does not fit as sharderd would run it (the message names the factor;
more pieces are never tried). Each piece is a matmul of its own, run after the previous one, so
the op pays its setup and exchange that many times: a cap keeps that bounded. A round power of two,
not tuned: no compile, the fake's included, chose it."""
SERIAL_OPS = frozenset({"MatMul"})


def serial_factor(op_type: str, out_shape: Sequence[int] | None) -> int:
    """The factor a probe of this node is retried with: the largest power of two up to
    ``MAX_SERIAL_FACTOR`` that divides the output's last axis (the output channels), or 0 when
    the node is not a MatMul, its output shape is unknown, or no factor of at least 2 divides."""
    if op_type not in SERIAL_OPS or not out_shape or int(out_shape[-1]) < 2:
        return 0
    channels, factor = int(out_shape[-1]), MAX_SERIAL_FACTOR
    while factor >= 2 and channels % factor:
        factor //= 2
    return factor if factor >= 2 else 0


def serial_probe(s: SearchState) -> Attempt | None:
    """The serialized probe, once the probe of a serializable MatMul ran out of the tiles' memory
    at the lowest AMP and until it started (a re-plan waits for it as for any running compile)."""
    lowest = s.settings.lowest_amp
    for a in s.attempts:
        if (
            a.outcome == "oom"
            and a.oom != "stream"
            and a.serializable is not None
            and not probe_proves(a, lowest)
        ):
            name, k = a.serializable
            attempt = Attempt(
                "probe",
                f"probe serialized ×{k}",
                1.0,
                (1.0,),
                ContentCorrection(),
                lowest,
                serialize=((name, k),),
            )
            return attempt if attempt not in s.asked else None
    return None


def probe_proves(a: Started, lowest: float) -> bool:
    """Whether an overflow of ``a`` can be the proof (grounds ``probe``): a probe at the lowest AMP
    with nothing left to try (its node is no MatMul PopART could serialize, or it was serialized)."""
    at_lowest = a.attempt.kind == "probe" and a.key.amp <= lowest
    return at_lowest and (a.serializable is None or bool(a.attempt.serialize))


def why_no_proof(a: Started, event: Finished, lowest: float) -> str | None:
    """None when the probe ``a``'s out-of-memory outcome (``event``) is the proof; else why it is
    none (empty when nothing needs saying: it is no probe, or a serialized retry comes first)."""
    if a.attempt.kind != "probe" or event.outcome != "oom" or not probe_proves(a, lowest):
        return ""
    if event.oom == "stream":
        return (
            f"; the probe (attempt {a.index}) ran out of host-stream memory, and it feeds the "
            "node's inputs from the host as no split does, so that proves nothing"
        )
    lost = sorted(set(a.attempt.serialize) - set(event.compiled_serialize or ()))
    if lost:
        names = ", ".join(f"{name!r} ×{k}" for name, k in lost)
        return (
            f"; the serialized probe (attempt {a.index}) compiled a model without "
            f"__serialize_matmul_* on {names} (lost in PopRT's conversion), so its overflow "
            "proves nothing"
        )
    return None


def learned(before: SearchState, after: SearchState, done: Started) -> SearchState:
    """``after`` (``before`` with ``done``'s outcome folded in) with matmul serialization applied:
    a compile written otherwise than the current serialization teaches no bytes, and a serialized
    probe that fits makes its serialization the current one, setting aside every measurement made
    without it (the memory model, the escalations and the planner's refusal start again)."""
    if done.attempt.serialize != before.serialized:
        after = replace(after, observations=before.observations)
    if done.attempt.kind != "probe" or not done.attempt.serialize or done.outcome != "ok":
        return after
    return replace(
        after,
        serialized=done.attempt.serialize,
        observations=(),
        escalation=(),
        escalations=0,
        no_split=None,
        settled=None,
    )
