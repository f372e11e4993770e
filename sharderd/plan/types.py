"""The plan as values: what each device runs and what it is predicted to cost."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["BottleneckHolder", "CutTensor", "Plan", "StageCost"]


@dataclass(frozen=True, slots=True)
class StageCost:
    index: int
    """Stage number == device (``__pipeline_stage`` == ``__ipu_number``)."""
    start: int
    stop: int
    """Positions [start, stop) in the plan's order."""
    num_nodes: int
    first_node: str
    last_node: str
    flops: float
    weight_bytes: int
    activation_bytes: int
    """Peak bytes live at once, the tensors received and held for sending included."""
    code_bytes: int
    recv_bytes: int
    send_bytes: int
    memory_bytes: int
    """weights + activations + code, as predicted."""
    budget_bytes: int
    """What the planner allowed: capacity / (safety margin × correction)."""
    capacity_bytes: int
    compute_s: float
    """Everything but device-to-device copies: ``flops_s + overhead_s + host_s``."""
    comm_s: float
    """``comm_in_s + comm_out_s``: receiving from and sending to the neighbouring stages."""
    time_s: float
    """``compute_s + comm_s``: the stage's predicted time per batch."""
    flops_s: float = 0.0
    """FLOPs at the target's effective rate (or measured node times, ``cost_model = "measured"``)."""
    overhead_s: float = 0.0
    """The target's per-op overhead of each compiled node by op type, none for a folded node (0 with
    measured node times, which include it)."""
    host_s: float = 0.0
    """Graph inputs streamed from the host and graph outputs sent back, at ``host_bytes_per_s``."""
    comm_in_s: float = 0.0
    comm_out_s: float = 0.0
    ops: int = 0
    """Its nodes the compiler compiles (``num_nodes`` less those folded into constants)."""

    @property
    def memory_fraction(self) -> float:
        return self.memory_bytes / self.capacity_bytes


@dataclass(frozen=True, slots=True)
class CutTensor:
    cut: int
    """Between stage ``cut - 1`` and stage ``cut``."""
    name: str
    bytes: int


@dataclass(frozen=True, slots=True)
class BottleneckHolder:
    kind: str
    """``host_output`` (sending graph outputs to the host), ``op`` (one node's compute alone) or
    ``host_input`` (streaming a graph input from the host, with its cheapest reader)."""
    node: str
    """The node that pays it (for an input: its cheapest reader in the slowest stage)."""
    op_type: str
    tensors: tuple[str, ...]
    """The graph outputs sent (``host_output``) or the input streamed (``host_input``)."""
    bytes: int
    """Bytes of ``tensors`` (0 for ``op``)."""
    time_s: float
    """What no split can move: ``c(v)``, or the input's transfer plus its cheapest reader."""
    transfer_s: float
    """Of ``time_s``, the host transfer (0 for ``op``)."""
    stage: int
    share: float
    """``time_s`` over the slowest stage's time."""

    def describe(self) -> str:
        us = f"{self.time_s * 1e6:,.1f} µs"
        names = f"{', '.join(self.tensors)} ({self.bytes:,} bytes)"
        what = {
            "host_output": f"the host transfer of output {names} from {self.node}",
            "host_input": f"the host transfer of input {names} to {self.node}",
        }.get(self.kind, f"op {self.node} ({self.op_type}) alone")
        return (
            f"{what}: {us}, {self.share:.0%} of stage {self.stage}; no split can move it, so no "
            "split or device count makes the slowest stage faster than that"
        )


@dataclass(frozen=True, slots=True)
class Plan:
    devices: int
    order_name: str
    order: np.ndarray
    """Node indices (file order) in planned order."""
    bounds: tuple[int, ...]
    """Stage s covers order positions [bounds[s], bounds[s+1])."""
    assignment: np.ndarray
    """int64 [N]: stage of each node, by file index."""
    stages: tuple[StageCost, ...]
    cut_tensors: tuple[CutTensor, ...]
    bottleneck_s: float
    lower_bound_s: float
    safety_margin: float
    memory_scale: tuple[float, ...]
    """Per-device correction of predicted memory (1.0 until a compile says otherwise)."""
    orders_tried: Mapping[str, float | None] = field(default_factory=dict)
    """Bottleneck per candidate order (None: did not fit)."""
    timings_s: Mapping[str, float] = field(default_factory=dict)
    probes: int = 0
    method: str = "orders"
    """What produced the split: ``ideals`` (DP over every valid split), ``contracted`` (the DP over
    the contracted graph: optimal over splits that keep each group together), ``neighbourhood``
    (the DP over the cuts near an order plan's cuts), ``orders`` (exact on each candidate order)
    or ``overfull`` (no split found within the estimate, none proven impossible: the least
    overfull split, for a compile to decide)."""
    proven_optimal: bool = False
    """True when no valid split has a smaller bottleneck (exhaustive DP, or the plan meets the bound)."""
    claim: str = ""
    """What is known of this split's optimality, in words for the report."""
    held_by: BottleneckHolder | None = None
    """The cost no split can move that dominates the slowest stage, if one does (``plan.held``)."""
    fewest_devices: int | None = None
    """The fewest devices whose plan is predicted within ``plan.fewest.THROUGHPUT_BAND`` of this
    plan's throughput (None: not searched, e.g. under corrections learned from compiles)."""
    fewest_bottleneck_s: float | None = None
    """That plan's bottleneck."""
    max_devices: int | None = None
    """Set when planned with ``--devices auto``: the most devices it could use (``devices`` is
    the fewest that keep the throughput of a plan on this many)."""

    @property
    def ratio_to_bound(self) -> float:
        return self.bottleneck_s / self.lower_bound_s if self.lower_bound_s > 0 else 1.0

    @property
    def digest(self) -> str:
        """Identifies the split itself: two plans with the same digest compile identically."""
        return hashlib.sha256(self.assignment.astype(np.int64).tobytes()).hexdigest()[:16]

    @property
    def slowest_stage(self) -> int:
        return max(range(len(self.stages)), key=lambda s: self.stages[s].time_s)
