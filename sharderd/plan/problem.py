"""One planning question, as the solvers past the order search share it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.target import Target

__all__ = ["Problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """This analysed graph onto devices of these memory caps, costed on this target."""

    analysis: Analysis
    target: Target
    compute_s: np.ndarray
    """float64 [N]: per-node compute seconds (FLOP model or measured)."""
    reference: np.ndarray
    """int64 [N]: the reference order a stage's nodes run in (``order.candidate_orders``' first)."""
    caps: np.ndarray
    """float64 [k]: bytes each device may hold, margin and corrections applied."""
    require_costed: bool
    """Every stage needs a node with FLOPs or weights (there are at least ``k`` of them)."""

    @property
    def devices(self) -> int:
        return len(self.caps)
