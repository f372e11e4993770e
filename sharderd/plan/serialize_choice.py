"""How many pieces to serialize a node into, and whether a rewrite is worth keeping.

Two reasons, each on its own rule (docs/planning.md "Serializing a node"):

- **too big** (``choose_pieces``): the node's weights alone exceed one device (then no split fits:
  the weights live on the device that runs the node, whatever the split). It gets the smallest
  ``k`` whose pieces each hold at most ``PIECE_SHARE`` of a device, so every piece leaves room for
  the rest of its stage.
- **bottleneck** (``bottleneck_pieces``, ``worth_keeping``): the node's own cost ``c(v)`` is over
  every other term of the lower bound, so no split can be balanced while it stays whole. It gets
  the smallest ``k`` with ``c(v) / k`` at most those terms, and the rewrite is kept only when the
  re-planned bottleneck is lower by more than ``BOTTLENECK_GAIN``.

``shard.serialize`` must be able to split the node; the planner then places the pieces like any
other node. Otherwise the user's graph stays as it is: serialization is an option, not a default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BOTTLENECK_GAIN",
    "PIECE_SHARE",
    "BottleneckTrial",
    "JoinInputs",
    "bottleneck_pieces",
    "choose_pieces",
    "floor_in_pieces",
    "worth_keeping",
]

PIECE_SHARE = 0.5
"""The most of one device's memory one piece's weights may take; the rest is for its stage's
activations, code and neighbours (half: a piece never needs a device to itself)."""


def choose_pieces(
    per_node: np.ndarray, splittable_rows: np.ndarray, capacity: float
) -> dict[int, int]:
    """Node index → pieces, for the splittable nodes whose weights alone exceed ``capacity``.

    ``splittable_rows[i]`` is how many pieces node i can be cut into at most (0: not splittable).
    A node that would need more pieces than that is left out (its proof of "does not fit" stands).
    """
    chosen = {}
    for i in np.flatnonzero(per_node > capacity):
        k = math.ceil(float(per_node[i]) / (capacity * PIECE_SHARE))
        if 2 <= k <= int(splittable_rows[i]):
            chosen[int(i)] = k
    return chosen


BOTTLENECK_GAIN = 0.10
"""How much lower (10%) the predicted bottleneck must be before a node serialized for speed is
kept. A policy, not a measured error: the rewrite changes the user's graph (k nodes and a
``Concat`` in place of one, its weight sliced into a new file, every compile of a different model),
so it is made only for a throughput gain a user would notice, and not for one the size of what the
cost model leaves out: each piece is priced at the whole op's FLOP rate, though a narrower matmul
runs at a lower share of the device's peak (on onnxruntime's CPU, the one head measured both ways
ran 13% faster where 34% was predicted: BENCHMARKS.md, "Serializing a node"). Independent of
``plan.perf.PERF_BAND``, which bounds what ``--optimal-perf`` compiles."""


def bottleneck_pieces(
    node_s: np.ndarray, total_s: float, devices: int, splittable_rows: np.ndarray
) -> dict[int, int]:
    """Node index → pieces, for the splittable nodes whose own cost holds every split up.

    ``node_s[i]`` is ``c(v)`` and ``total_s`` is ``W`` of the lower bound (``bounds.node_work``).
    Every split's slowest stage costs at least ``floor = max(W / devices, the dearest node that
    cannot be split)`` and at least ``c(v)``; a splittable node with ``c(v) > floor`` is what holds
    the bound above the rest. It gets the smallest ``k`` with ``c(v) / k <= floor``, at most
    ``splittable_rows[i]`` (how many pieces it can be cut into; below 2: not splittable).
    """
    splittable = splittable_rows >= 2
    whole = node_s[~splittable]
    floor = max(total_s / devices, float(whole.max()) if len(whole) else 0.0)
    if floor <= 0:
        return {}
    chosen = {}
    for i in np.flatnonzero(splittable & (node_s > floor)):
        k = math.ceil(float(node_s[i]) / floor)
        chosen[int(i)] = min(k, int(splittable_rows[i]))
    return chosen


def worth_keeping(before_s: float, after_s: float) -> bool:
    """The serialized plan's bottleneck is lower by more than ``BOTTLENECK_GAIN``."""
    return after_s < before_s * (1 - BOTTLENECK_GAIN)


@dataclass(frozen=True, slots=True)
class BottleneckTrial:
    """A rewrite for the bottleneck that was priced: the nodes and pieces, the first plan's
    predicted bottleneck whole, the floor no split of the graph in pieces beats
    (``floor_in_pieces``), the first plan in pieces when one was made, and whether it was kept."""

    pieces: tuple[tuple[str, str, int], ...]
    """(node, op, pieces) of each node cut."""
    before_s: float
    floor_s: float
    planned: bool
    """False when the floor already ruled the rewrite out (``worth_keeping(before_s, floor_s)``
    is false): no plan in pieces was made."""
    after_s: float | None
    """The first plan's bottleneck in pieces; None when not planned or no split fits."""
    kept: bool


JoinInputs = tuple[int, np.ndarray, np.ndarray]
"""A joining node, the nodes producing its inputs, and those inputs' bytes."""


def floor_in_pieces(
    node_s: np.ndarray, link_bytes_per_s: float, lower_bound_s: float, joins: list[JoinInputs]
) -> float:
    """No split of a graph in pieces has a slowest stage under this: its lower bound
    (``bounds.lower_bound_all_splits``), or the stage of a joining node (the ``Concat`` of column
    pieces). That stage runs the join, and for each piece either runs it too or receives its output
    over a link: at least ``c(join) + sum over pieces of min(c(piece), bytes / link)``.
    ``node_s`` is ``c(v)`` (``bounds.node_work``); each join is (its node, its inputs' producer
    nodes and bytes)."""
    floor = lower_bound_s
    for join, producers, sizes in joins:
        each = np.minimum(node_s[producers], np.asarray(sizes, dtype=np.float64) / link_bytes_per_s)
        floor = max(floor, float(node_s[join] + each.sum()))
    return floor
