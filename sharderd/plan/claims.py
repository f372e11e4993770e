"""The words ``plan.claim`` uses for the secondary objective: what "optimal" means beyond the
slowest stage, for the DPs over ideals (``leximax.py``) and for one order (``balance_order.py``)."""

from __future__ import annotations

from sharderd.plan.balance_order import MAX_PAIRS

__all__ = ["LEXICOGRAPHIC", "order_balance_claim"]

LEXICOGRAPHIC = ", lexicographically: the slowest stage least, then the next slowest, and so on"
"""Appended to a DP's "optimal over ..." claim: the DPs keep the leximax-least split."""


def order_balance_claim(order: str, balanced: bool) -> str:
    """What is known of the stages other than the slowest in an order search's plan."""
    if balanced:
        return f"; then the next slowest stage least, and so on, over the `{order}` order's splits"
    return (
        f"; the other stages balanced greedily along the `{order}` order (balancing them exactly "
        f"weighs at most {MAX_PAIRS:,} candidate stages; this needed more)"
    )
