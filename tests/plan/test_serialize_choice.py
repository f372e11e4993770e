"""choose_pieces: only nodes too big for a device, the smallest k within PIECE_SHARE."""

from __future__ import annotations

import numpy as np

from sharderd.plan.serialize_choice import PIECE_SHARE, choose_pieces, node_weight_bytes


def test_only_nodes_over_a_device_are_cut_into_the_fewest_pieces() -> None:
    per_node = np.array([100.0, 250.0, 2000.0, 1001.0])
    chosen = choose_pieces(per_node, np.array([10, 10, 10, 10]), capacity=1000.0)
    assert chosen == {2: 4, 3: 3}
    for node, k in chosen.items():
        assert per_node[node] / k <= 1000.0 * PIECE_SHARE < per_node[node] / (k - 1)


def test_a_node_that_cannot_be_split_enough_is_left_to_the_proof() -> None:
    assert choose_pieces(np.array([5000.0]), np.array([0]), capacity=1000.0) == {}
    assert choose_pieces(np.array([5000.0]), np.array([3]), capacity=1000.0) == {}


def test_node_weight_bytes_sums_each_nodes_weights() -> None:
    got = node_weight_bytes(np.array([0, 2, 2, 3]), np.array([0, 1, 1]), np.array([4, 6]))
    np.testing.assert_array_equal(got, [10.0, 0.0, 6.0])
