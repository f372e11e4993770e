"""How many pieces to serialize a node into: only the nodes no split can hold without it.

A node is serialized when its weights alone exceed one device (then no split fits: the weights
live on the device that runs the node, whatever the split) and ``shard.serialize`` can split it.
It gets the smallest ``k`` whose pieces each hold at most ``PIECE_SHARE`` of a device, so every
piece leaves room for the rest of its stage; the planner then places the pieces like any other
node. Nodes whose weights fit are left alone: serialization is an option, not a default.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["PIECE_SHARE", "choose_pieces"]

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
