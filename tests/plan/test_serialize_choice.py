"""choose_pieces: only nodes too big for a device, the smallest k within PIECE_SHARE."""

from __future__ import annotations

import numpy as np

from sharderd.plan.serialize_choice import PIECE_SHARE, choose_pieces


def test_only_nodes_over_a_device_are_cut_into_the_fewest_pieces() -> None:
    per_node = np.array([100.0, 250.0, 2000.0, 1001.0])
    chosen = choose_pieces(per_node, np.array([10, 10, 10, 10]), capacity=1000.0)
    assert chosen == {2: 4, 3: 3}
    for node, k in chosen.items():
        assert per_node[node] / k <= 1000.0 * PIECE_SHARE < per_node[node] / (k - 1)


def test_a_node_that_cannot_be_split_enough_is_left_to_the_proof() -> None:
    assert choose_pieces(np.array([5000.0]), np.array([0]), capacity=1000.0) == {}
    assert choose_pieces(np.array([5000.0]), np.array([3]), capacity=1000.0) == {}
