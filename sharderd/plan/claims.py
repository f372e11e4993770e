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
        return (
            f"; the other stages are the lexicographically least (the next slowest least, then "
            f"the next ...) of the `{order}` order's contiguous splits with this slowest stage"
        )
    return (
        f"; the other stages are balanced greedily along the `{order}` order (the exact balance "
        f"weighs at most {MAX_PAIRS:,} stage candidates and this order needed more)"
    )
