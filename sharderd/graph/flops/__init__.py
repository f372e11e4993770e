"""FLOPs of one ONNX node from its static shapes: the compute half of the cost model.

The planner balances stages by compute, so every node needs a number, even an op nobody taught us:
those get ``DEFAULT_FLOPS_PER_OUTPUT_ELEMENT`` per output element and ``known=False`` so callers can
say how much of a plan rests on guesses. One multiply-accumulate counts as 2 FLOPs; a transcendental
(exp, log, tanh, erf...) as 4, because it costs several ALU ops on every device we target. Counts
are estimates to balance stages with, not profiles: ``docs/flops.md`` lists every formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from sharderd.graph.flops.operands import Shape, numel
from sharderd.graph.flops.table import RULES

__all__ = ["DEFAULT_FLOPS_PER_OUTPUT_ELEMENT", "FlopsEstimate", "Shape", "node_flops"]

DEFAULT_FLOPS_PER_OUTPUT_ELEMENT: float = 1.0
"""An op outside the table is assumed to do one FLOP per output element: cheap, but never free."""


@dataclass(frozen=True, slots=True)
class FlopsEstimate:
    """FLOPs of one node, and whether they came from the op's own formula."""

    flops: float
    known: bool
    """False when the op is not in the table or a needed shape is unknown: the default was used."""


def node_flops(
    node: onnx.NodeProto, in_shapes: Sequence[Shape | None], out_shapes: Sequence[Shape | None]
) -> FlopsEstimate:
    """FLOPs of ``node``; ``in_shapes[k]`` is the static shape of ``node.input[k]`` (None: unknown).

    Control flow (If/Loop/Scan) counts 0 here: the caller adds what its bodies cost.
    """
    ins = [_clean(s) for s in in_shapes]
    outs = [_clean(s) for s in out_shapes]
    domain = "" if node.domain == "ai.onnx" else node.domain
    rule = RULES.get((domain, node.op_type))
    if rule is not None:
        try:
            flops = rule(node, ins, outs)
        except (IndexError, ValueError):  # a rank the op does not allow: the validator's business
            flops = None
        if flops is not None:
            return FlopsEstimate(float(flops), True)
    known_outs = [numel(s) for s in outs if s is not None]
    return FlopsEstimate(float(sum(known_outs)) * DEFAULT_FLOPS_PER_OUTPUT_ELEMENT, False)


def _clean(shape: Sequence[int] | None) -> Shape | None:
    """A shape with a negative (unresolved) dim is as good as unknown."""
    if shape is None or any(int(d) < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)
