"""Device descriptions the planner plans for.

A target says how much memory one device has, how fast it computes and how fast tensors move
between devices and to the host. Built-ins cover Graphcore IPUs (numbers from Graphcore's
datasheets and Poplar's out-of-memory texts, see ``../shared/reference/poprt-facts.md`` §5) and a
generic CPU for the onnxruntime backend. Custom targets come from ``[targets.<name>]`` in
``sharderd.toml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = ["BUILTIN_TARGETS", "HEAVY_FACTOR", "HEAVY_OPS", "MK2_TILES", "VIEW_OPS", "Target"]

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
"""Ops Poplar implements as views of their input's memory: no compute set, no code, no time."""

HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
"""Ops poplin plans as several compute sets (an estimate, see ``HEAVY_FACTOR``)."""

HEAVY_FACTOR = 3
"""An estimate, not a measurement: a poplin convolution or matmul is planned as about three compute
sets (rearranging the operands, the partial products, the reduction of the partials), each with
its own vertex code, exchange and sync, where an elementwise op is one. So it costs three times the
target's default row (``op_overhead_s``, ``code_bytes_per_node``) in both time and code."""

DeviceKind = Literal["ipu", "gpu", "cpu"]


@dataclass(frozen=True, slots=True)
class Target:
    """One accelerator, as the cost model sees it."""

    name: str
    """How configs and reports refer to it."""
    kind: DeviceKind
    """Which runtime family compiles for it (``ipu`` → poprt, else onnxruntime)."""
    memory_bytes: int
    """Usable memory of one device (all tiles for an IPU)."""
    flops_per_s: float
    """Peak FLOP/s at the model's precision."""
    link_bytes_per_s: float
    """Device-to-device bandwidth between neighbouring pipeline stages."""
    host_bytes_per_s: float
    """Host-to-device bandwidth for graph inputs and outputs."""
    tiles: int = 0
    """Tiles per device (0: not a tiled device). Poplar names a global tile on OOM."""
    bytes_per_tile: int = 0
    """Memory of one tile (638976 on Mk2): Poplar's OOM text reports bytes used on one tile."""
    efficiency: float = 0.4
    """Fraction of peak FLOP/s a real model reaches; scales compute time, not balance."""
    code_bytes_per_node: int = 0
    """Code/exchange/control memory one compiled op costs on the device, the default row of ``code_bytes_by_op`` (a prior; OOM feedback corrects it)."""
    op_overhead_s: float = 0.0
    """Fixed time per compiled op (sync, launch), the default row of ``op_overhead_s_by_op``, so thousands of tiny ops are not free."""
    op_overhead_s_by_op: Mapping[str, float] = field(default_factory=dict)
    """Fixed time per compiled node by op type, overriding the rule (views 0, Conv/MatMul/Gemm 3 × ``op_overhead_s``, any other op ``op_overhead_s``)."""
    code_bytes_by_op: Mapping[str, int] = field(default_factory=dict)
    """Code bytes per compiled node by op type, overriding the rule (views 0, Conv/MatMul/Gemm 3 × ``code_bytes_per_node``, any other op ``code_bytes_per_node``)."""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"target {self.name}: memory_bytes must be > 0")
        if self.flops_per_s <= 0 or self.link_bytes_per_s <= 0 or self.host_bytes_per_s <= 0:
            raise ValueError(f"target {self.name}: flops_per_s and bandwidths must be > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"target {self.name}: efficiency must be in (0, 1]")
        if self.tiles < 0 or self.bytes_per_tile < 0:
            raise ValueError(f"target {self.name}: tiles and bytes_per_tile must be >= 0")
        tables = (*self.op_overhead_s_by_op.values(), *self.code_bytes_by_op.values())
        if self.op_overhead_s < 0 or self.code_bytes_per_node < 0 or min(tables, default=0) < 0:
            raise ValueError(f"target {self.name}: per-op overhead and code must be >= 0")

    @property
    def effective_flops_per_s(self) -> float:
        return self.flops_per_s * self.efficiency

    def op_overhead_for(self, op_type: str) -> float:
        """Fixed time one compiled node of ``op_type`` costs: the table, else the rule."""
        found = self.op_overhead_s_by_op.get(op_type)
        return _by_rule(op_type, self.op_overhead_s) if found is None else float(found)

    def code_bytes_for(self, op_type: str) -> int:
        """Code/exchange/control bytes one compiled node of ``op_type`` costs: the table, else the rule."""
        found = self.code_bytes_by_op.get(op_type)
        return int(_by_rule(op_type, self.code_bytes_per_node)) if found is None else int(found)

    def overhead_table(self) -> dict[str, float]:
        """Every op type the rule or the table prices apart from the default row."""
        ops = sorted(VIEW_OPS | HEAVY_OPS | set(self.op_overhead_s_by_op))
        return {op: self.op_overhead_for(op) for op in ops}

    def code_table(self) -> dict[str, int]:
        ops = sorted(VIEW_OPS | HEAVY_OPS | set(self.code_bytes_by_op))
        return {op: self.code_bytes_for(op) for op in ops}

    def tile_to_device(self, global_tile: int) -> int:
        """Poplar numbers tiles across all IPUs of a multi-IPU target: IPU i owns [i*T, (i+1)*T)."""
        if self.tiles <= 0:
            raise ValueError(f"target {self.name} has no tiles")
        return global_tile // self.tiles

    def with_memory(self, memory_bytes: int) -> Target:
        return replace(self, memory_bytes=memory_bytes)


def _by_rule(op_type: str, default: float) -> float:
    if op_type in VIEW_OPS:
        return 0.0
    return default * HEAVY_FACTOR if op_type in HEAVY_OPS else default


MK2_TILES = 1472
"""Tiles of one Mk2 (and Bow) IPU."""
_MK2_TILE_BYTES = 638_976

BUILTIN_TARGETS: dict[str, Target] = {
    "ipu-mk2": Target(
        name="ipu-mk2",
        kind="ipu",
        memory_bytes=MK2_TILES * _MK2_TILE_BYTES,
        tiles=MK2_TILES,
        bytes_per_tile=_MK2_TILE_BYTES,
        flops_per_s=250e12,
        link_bytes_per_s=64e9,
        host_bytes_per_s=16e9,
        code_bytes_per_node=64 * 1024,
        op_overhead_s=1e-6,
    ),
    "ipu-bow": Target(
        name="ipu-bow",
        kind="ipu",
        memory_bytes=MK2_TILES * _MK2_TILE_BYTES,
        tiles=MK2_TILES,
        bytes_per_tile=_MK2_TILE_BYTES,
        flops_per_s=350e12,
        link_bytes_per_s=64e9,
        host_bytes_per_s=16e9,
        code_bytes_per_node=64 * 1024,
        op_overhead_s=0.75e-6,
    ),
    "ipu-mk1": Target(
        name="ipu-mk1",
        kind="ipu",
        memory_bytes=1216 * 256 * 1024,
        tiles=1216,
        bytes_per_tile=256 * 1024,
        flops_per_s=124.5e12,
        link_bytes_per_s=40e9,
        host_bytes_per_s=16e9,
        code_bytes_per_node=48 * 1024,
        op_overhead_s=1.5e-6,
    ),
    "cpu": Target(
        name="cpu",
        kind="cpu",
        memory_bytes=8 * 1024**3,
        flops_per_s=50e9,
        link_bytes_per_s=10e9,
        host_bytes_per_s=10e9,
        efficiency=1.0,
        op_overhead_s=5e-6,
    ),
}
