"""What ``plan.beyond_orders`` says a plan is optimal over (its claims), word for word at each
branch: the DP over every split, over the contracted graph's groups, over the neighbourhood of the
order plan's cuts, and what the DPs showed when the order plan stands (a gain under ``DP_GAIN``,
none, or past the limits)."""

from __future__ import annotations

import numpy as np

from sharderd.plan.beyond_orders import (
    DP_GAIN,
    _contracted_claim,
    _near_claim,
    _nodes,
    _searched,
)
from sharderd.plan.claims import LEXICOGRAPHIC
from sharderd.plan.contract import Groups
from sharderd.plan.ideals import IdealSplit
from sharderd.plan.neighbourhood import Neighbourhood


def _groups(nodes: int, count: int) -> Groups:
    return Groups(np.arange(nodes) % count, count, (), (), ())


WHOLE, MERGED = _groups(5, 5), _groups(7, 2)


def test_the_exact_dp_claims_every_split_and_the_contracted_one_its_groups() -> None:
    assert _contracted_claim(40, WHOLE) == (
        f"optimal over every valid split (DP over all 40 ideals){LEXICOGRAPHIC}"
    )
    one_merged = _groups(6, 5)  # a single node shares a group: not every split any more
    assert _contracted_claim(40, one_merged).startswith(
        "optimal over the splits that keep shape arithmetic and constant-only nodes with their "
        "neighbours (6 nodes in 5 groups; DP over 40 ideals)"
    )


def test_the_neighbourhood_claim_counts_its_window_and_rounds() -> None:
    near = Neighbourhood(None, 1.0, window=1, ideals=9, rounds=1)
    assert _near_claim(near, "file", WHOLE) == (
        "optimal over the splits whose every cut lies within 1 node of the previous plan's cuts "
        f"(1 round from the `file` order's plan; DP over 9 ideals){LEXICOGRAPHIC}; not proven "
        "over every split: the DP over the whole graph was past its limits"
    )
    two = Neighbourhood(None, 1.0, window=2, ideals=9, rounds=2)
    assert (
        "within 2 nodes of the previous plan's cuts, keeping the contracted groups together (2 rounds"
        in (_near_claim(two, "file", MERGED))
    )
    assert (_nodes(0), _nodes(1), _nodes(2)) == ("0 nodes", "1 node", "2 nodes")


def test_what_the_dps_showed_when_the_order_plan_stands() -> None:
    near = Neighbourhood(None, 1.0, window=3, ideals=12, rounds=1)
    assert _searched(None, MERGED, 1.0, near) == (
        "the DP over the contracted graph (2 groups) was past its limits; none of the splits whose "
        f"cuts lie within 3 nodes of this plan's cuts is {DP_GAIN:.0%} faster (DP over 12 ideals)"
    )
    assert _searched(None, MERGED, 1.0, None) == (
        "the DP over the contracted graph (2 groups) was past its limits, so splits outside those "
        "orders were not searched"
    )
    split = np.zeros(5, dtype=np.int64)
    slower = IdealSplit(split, 1.0, 30)
    assert _searched(slower, WHOLE, 1.0, None) == (
        "none of every valid split (DP over all 30 ideals) is faster"
    )
    assert _searched(IdealSplit(None, 0.5, 30), WHOLE, 1.0, None).startswith("none of ")
    faster = IdealSplit(split, 1.99, 30)
    assert _searched(faster, MERGED, 2.0, None) == (
        "the best of the splits that keep the 2 groups of the contracted graph together (DP over "
        "its 30 ideals) is 0.50% faster, under the 1% worth a stage boundary away from the order's "
        "layer ends, so the order's split is kept"
    )
    hair = IdealSplit(split, 1.0 - 2e-9, 30)  # a rounding error is no gain
    assert _searched(hair, WHOLE, 1.0, None).startswith("the best of every valid split")
    assert _searched(IdealSplit(split, 1.0 - 1e-10, 30), WHOLE, 1.0, None).startswith("none of")


def test_a_skipped_dp_leaves_the_order_plan_standing_with_the_reason_as_its_claim() -> None:
    from sharderd.plan.beyond_orders import Found, improve

    found = improve(None, start=None, upper=1.0, skip="past the limits")  # type: ignore[arg-type]
    assert found == Found(None, "", "past the limits", False)
