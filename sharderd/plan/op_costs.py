"""What each node costs the device by being compiled: per-op time overhead and code bytes.

A node the compiler folds into a constant (``Analysis.folded``) is never compiled: it costs no
overhead and no code (its result is held as a weight of the nodes that read it). Every other node
costs what the target's table gives for its op type (``Target.op_overhead_for`` /
``Target.code_bytes_for``). These arrays are the one place the planner reads either number.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.target import Target

__all__ = ["node_code_bytes", "node_overhead_s"]


def node_overhead_s(analysis: Analysis, target: Target) -> np.ndarray:
    """float64 [N]: the fixed time each node adds (sync, launch), 0 for a folded node."""
    return _priced(analysis, target.op_overhead_for).astype(np.float64)


def node_code_bytes(analysis: Analysis, target: Target) -> np.ndarray:
    """int64 [N]: code/exchange/control bytes each node adds to its device, 0 for a folded node."""
    return _priced(analysis, target.code_bytes_for).astype(np.int64)


def _priced(analysis: Analysis, price: Callable[[str], float]) -> np.ndarray:
    """Each compiled node at its op type's price (looked up once per op type), 0 when folded."""
    op_types = analysis.flow.op_types
    by_op = {op: price(op) for op in set(op_types)}
    values = np.fromiter((by_op[op] for op in op_types), dtype=np.float64, count=len(op_types))
    return np.where(analysis.compiled, values, 0.0)
