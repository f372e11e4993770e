"""choose_pieces: only nodes too big for a device, the smallest k within PIECE_SHARE; bottleneck_pieces:
only splittable nodes over every other term of the lower bound; worth_keeping: the threshold,
literal numbers just inside and just outside it."""

from __future__ import annotations

import numpy as np

from sharderd.plan.serialize_choice import (
    PIECE_SHARE,
    bottleneck_pieces,
    choose_pieces,
    worth_keeping,
)


def test_only_nodes_over_a_device_are_cut_into_the_fewest_pieces() -> None:
    per_node = np.array([100.0, 250.0, 2000.0, 1001.0])
    chosen = choose_pieces(per_node, np.array([10, 10, 10, 10]), capacity=1000.0)
    assert chosen == {2: 4, 3: 3}
    for node, k in chosen.items():
        assert per_node[node] / k <= 1000.0 * PIECE_SHARE < per_node[node] / (k - 1)


def test_a_node_exactly_a_device_is_left_whole_and_one_over_is_cut() -> None:
    """The weights exactly a device's are not over it; a byte more is, into the fewest pieces
    (3 at ``PIECE_SHARE`` 0.5), even when that is exactly as many as the node can be cut into."""
    assert choose_pieces(np.array([1000.0]), np.array([10]), capacity=1000.0) == {}
    assert choose_pieces(np.array([1001.0]), np.array([3]), capacity=1000.0) == {0: 3}
    assert choose_pieces(np.array([1001.0]), np.array([2]), capacity=1000.0) == {}


def test_a_node_that_cannot_be_split_enough_is_left_to_the_proof() -> None:
    assert choose_pieces(np.array([5000.0]), np.array([0]), capacity=1000.0) == {}
    assert choose_pieces(np.array([5000.0]), np.array([3]), capacity=1000.0) == {}


def test_a_node_over_every_other_bound_term_is_cut_to_that_term() -> None:
    # W = 20, 4 devices: the balanced share is 5; node 1 (12) holds every split above it
    node_s = np.array([2.0, 12.0, 3.0, 3.0])
    assert bottleneck_pieces(node_s, 20.0, 4, np.array([0, 64, 64, 0])) == {1: 3}
    assert 12.0 / 3 <= 20.0 / 4 < 12.0 / 2


def test_the_dearest_node_that_cannot_be_split_sets_the_floor() -> None:
    # node 0 (8) cannot be split: no split beats 8, so node 1 (12) needs only 2 pieces of 6 ...
    node_s = np.array([8.0, 12.0, 1.0])
    assert bottleneck_pieces(node_s, 21.0, 4, np.array([0, 64, 0])) == {1: 2}
    # ... and a splittable node under that floor holds nothing up: it is left whole
    assert bottleneck_pieces(np.array([8.0, 7.0, 1.0]), 16.0, 4, np.array([0, 64, 0])) == {}


def test_nodes_that_cannot_be_split_or_do_not_hold_the_bound_up_are_left_alone() -> None:
    node_s = np.array([2.0, 12.0, 3.0, 3.0])
    assert bottleneck_pieces(node_s, 20.0, 4, np.array([64, 0, 64, 64])) == {}
    assert bottleneck_pieces(node_s, 20.0, 4, np.array([64, 1, 64, 64])) == {}
    assert bottleneck_pieces(node_s, 20.0, 1, np.array([64, 64, 64, 64])) == {}


def test_pieces_are_bounded_by_what_the_node_can_be_cut_into() -> None:
    assert bottleneck_pieces(np.array([1.0, 90.0]), 91.0, 8, np.array([0, 4])) == {1: 4}


def test_a_rewrite_is_kept_only_when_the_bottleneck_drops_by_more_than_a_tenth() -> None:
    assert worth_keeping(2.0e-3, 1.799e-3)  # 10.05% lower: kept
    assert not worth_keeping(2.0e-3, 1.801e-3)  # 9.95% lower: not worth changing the graph
    assert not worth_keeping(1.0, 0.9)  # exactly 10%: "more than" is strict
    assert worth_keeping(1.0, 0.8999)
    assert not worth_keeping(1.0, 1.0)
    assert not worth_keeping(1.0, 2.0)


def test_a_node_exactly_at_the_floor_is_left_whole_and_two_pieces_is_a_split() -> None:
    """In seconds, as the planner gives them (every cost far under 1): node 1 at exactly the
    balanced share W / devices holds nothing up; node 2 just over it is cut, into at most the 2
    pieces it can be cut into; with every node splittable the floor is that share alone."""
    node_s = np.array([1e-6, 5e-6, 5.5e-6, 8.5e-6])  # W = 20 µs, 4 devices: 5 µs each
    rows = np.array([0, 64, 2, 64])
    assert bottleneck_pieces(node_s, 20e-6, 4, rows) == {2: 2, 3: 2}
    assert bottleneck_pieces(node_s, 20e-6, 4, np.full(4, 64)) == {2: 2, 3: 2}
