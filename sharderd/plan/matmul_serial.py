"""PopART's own per-op matmul serialization, for the probe's node (docs/search.md, "The probe").

PopART reads two attributes on a MatMul (poprt-facts.md, PopART attribute names):
``__serialize_matmul_mode`` and ``__serialize_matmul_factor``. It then computes the op as that many
pieces one after the other on its own IPU: the same weights on that IPU, less temporary memory at
a time. So a MatMul that ran out of memory alone on one device is no proof of "does not fit"
until it ran out serialized too. The rule is one retry, never a model of what serializing saves:
when the probe's node is a MatMul and its probe overflowed at the lowest AMP, the probe is compiled
once more with ``SERIAL_MODE`` and the largest factor ``serial_factor`` allows. An overflow there
is the proof (grounds ``probe``, "even serialized ×k"); a fit makes every later attempt write that
node with those two attributes, and what earlier compiles measured without them is set aside (a
different program). Gemm is left out: PopART lowers it to a MatMul by a pattern, and whether the
attribute survives that is not documented.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from sharderd.plan.content import ContentCorrection

if TYPE_CHECKING:
    from sharderd.plan.search import Attempt, SearchState, Started

__all__ = [
    "MAX_SERIAL_FACTOR",
    "SERIAL_MODE",
    "SERIAL_OPS",
    "Serialization",
    "learned",
    "probe_proves",
    "serial_factor",
    "serial_probe",
]

Serialization = tuple[tuple[str, int], ...]
"""MatMuls written with PopART's serialization: (node name, factor)."""

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
    """The serialized probe, once the probe of a serializable MatMul ran out of memory at the
    lowest AMP and until it started (a re-plan waits for it as for any running compile)."""
    from sharderd.plan.search import Attempt

    lowest = s.settings.lowest_amp
    for a in s.attempts:
        if a.outcome == "oom" and a.serializable is not None and not probe_proves(a, lowest):
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
    """Whether an overflow of ``a`` is the proof (grounds ``probe``): a probe at the lowest AMP
    with nothing left to try (its node is no MatMul PopART could serialize, or it was serialized)."""
    at_lowest = a.attempt.kind == "probe" and a.key.amp <= lowest
    return at_lowest and (a.serializable is None or bool(a.attempt.serialize))


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
