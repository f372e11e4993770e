"""Per-node times for the planner, from onnxruntime's profiler, on the graph that is measured.

The planner needs seconds per *original* node, but with graph optimizations on onnxruntime runs
other nodes: Conv+BatchNormalization+Relu become one Conv, MatMul+Add+Relu a FusedGemm, and
with ``all`` on a CPU, convolutions run in the NCHWc layout behind Reorder nodes under new
names. Profiling with optimizations off keeps the names but times a different program (each
BatchNormalization and Relu costs a kernel launch and a pass over memory the fused model never
makes), so the plan over-predicts and mis-weights fused ops.

Here a stage is profiled at the level it is measured at, onnxruntime saves the graph it
executes, and each executed node's time goes back to the original nodes it replaced: nodes are
grouped into regions the two graphs agree on (tensors both have bound them), a region's time
is split over its original nodes in proportion to a profile with optimizations off (which says
how the unfused work divides), and nodes folded away at load cost 0.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from sharderd.backends.ort_failure import AttemptFailure
from sharderd.backends.ort_runner import StageRunner
from sharderd.shard.split import StageModel

__all__ = [
    "StageProfile",
    "attribute_times",
    "node_times_from_trace",
    "profile_stage",
    "run_times_from_trace",
]

_KERNEL = "_kernel_time"
_NCHWC = "_nchwc"


@dataclass(frozen=True, slots=True)
class StageProfile:
    node_times_s: Mapping[str, float]
    """Every node of the stage, by its original name: its share of what really ran."""
    kernel_s: float
    """Sum of the executed kernels' median times: what the planner sees of this stage."""
    run_s: float
    """Median of onnxruntime's whole ``run``: kernels plus the executor's own overhead."""
    executed_nodes: int
    """Nodes onnxruntime ran (after fusion and layout changes)."""
    scale: float = 1.0
    """Factor ``node_times_s`` were multiplied by to match the stage's unprofiled time."""

    def scaled_to(self, measured_s: float) -> StageProfile:
        """Node times scaled to sum to ``measured_s``, the stage's median without the profiler.

        The profiler slows what it times (about 3.5 µs per kernel on a 2-core VM, doubling a
        chain of small MatMuls), and the plan is compared with unprofiled runs.
        """
        if self.kernel_s <= 0 or measured_s <= 0:
            return self
        scale = measured_s / self.kernel_s
        times = {name: t * scale for name, t in self.node_times_s.items()}
        return replace(self, node_times_s=times, scale=self.scale * scale)

    def summary(self) -> dict[str, Any]:
        return {
            "kernel_s": self.kernel_s,
            "run_s": self.run_s,
            "scale": self.scale,
            "executed_nodes": self.executed_nodes,
            "nodes": len(self.node_times_s),
        }


def profile_stage(runner: StageRunner, stage: StageModel, env: Mapping[str, Any]) -> StageProfile:
    """Profile ``stage`` at ``options.profile_level``; one session alive at a time."""
    level = runner.options.profile_level
    executed_times, run_s, executed = _profiled(runner, stage, env, level, save=level != "off")
    if level == "off":
        weights: Mapping[str, float] = executed_times
        executed = stage.model.graph
    else:
        weights, _, _ = _profiled(runner, stage, env, "off", save=False)
    return StageProfile(
        node_times_s=attribute_times(stage.model.graph, executed, executed_times, weights),
        kernel_s=float(sum(executed_times.values())),
        run_s=run_s,
        executed_nodes=len(executed_times),
    )


def attribute_times(
    original: onnx.GraphProto,
    executed: onnx.GraphProto | None,
    executed_times: Mapping[str, float],
    weights: Mapping[str, float],
) -> dict[str, float]:
    """Seconds per original node from the times of the nodes onnxruntime executed.

    Each region's time (see ``_regions``) is split over its original nodes in proportion to
    ``weights``, evenly when those are all 0. Original nodes in a region nothing executes
    (folded, eliminated) get 0; time no original node explains is spread over the whole stage
    the same way. Without ``executed``, names alone match.
    """
    names = [node.name for node in original.node]
    weight = np.array([max(float(weights.get(name, 0.0)), 0.0) for name in names])
    share = np.zeros(len(names))
    stray = 0.0
    if executed is None:
        index = {name: i for i, name in enumerate(names)}
        for name, seconds in executed_times.items():
            if name in index:
                share[index[name]] += seconds
            else:
                stray += seconds
        return _named(names, share + _split(stray, weight))
    original_region, executed_region = _regions(original, executed)
    region_time: dict[int, float] = defaultdict(float)
    for node, region in zip(executed.node, executed_region, strict=True):
        region_time[region] += executed_times.get(node.name, 0.0)
    ran = {node.name for node in executed.node}
    stray = sum(seconds for name, seconds in executed_times.items() if name not in ran)
    for region, seconds in region_time.items():
        ids = np.flatnonzero(original_region == region)
        if len(ids):
            share[ids] += _split(seconds, weight[ids])
        else:
            stray += seconds
    return _named(names, share + _split(stray, weight))


def _regions(original: onnx.GraphProto, executed: onnx.GraphProto) -> tuple[np.ndarray, np.ndarray]:
    """Region id of every original and every executed node: the finest grouping both agree on.

    An original node joins the executed node that produces the same tensor, has its name, or
    computes its output in another layout (onnxruntime's NCHWc transformer names such a node
    ``<tensor>_nchwc`` and links NCHWc nodes by new tensors). Two original nodes share a region
    when a tensor between them vanished (it was fused); two executed nodes when a tensor between
    them is new and its producer has no original counterpart (a reorder, a fused intermediate).
    """
    n, m = len(original.node), len(executed.node)
    regions = _UnionFind(n + m)
    produced_o, read_o = _producers_and_readers(original.node, 0)
    produced_e, read_e = _producers_and_readers(executed.node, n)
    by_name = {node.name: i for i, node in enumerate(original.node)}
    anchored, alias = set(), {}
    for j, node in enumerate(executed.node):
        if node.name in by_name:
            anchored.add(n + j)
            regions.union(n + j, by_name[node.name])
        tensor = node.name.removesuffix(_NCHWC)
        if tensor != node.name and tensor in produced_o:
            anchored.add(n + j)
            alias[tensor] = n + j
    known_o = {
        *produced_o,
        *(v.name for v in original.input),
        *(t.name for t in original.initializer),
    }
    known_e = {
        *produced_e,
        *alias,
        *read_e,
        *(v.name for v in (*executed.input, *executed.output)),
        *(t.name for t in executed.initializer),
    }
    for tensor, node in produced_o.items():
        if tensor not in known_e:
            for reader in read_o.get(tensor, ()):
                regions.union(node, reader)
        for twin in (produced_e.get(tensor), alias.get(tensor)):
            if twin is not None:
                regions.union(node, twin)
    for tensor, node in produced_e.items():
        if tensor not in known_o and node not in anchored:
            for reader in read_e.get(tensor, ()):
                regions.union(node, reader)
    roots = np.array([regions.find(x) for x in range(n + m)], dtype=np.int64)
    return roots[:n], roots[n:]


class _UnionFind:
    __slots__ = ("parent",)

    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def node_times_from_trace(trace: Any, names: Sequence[str], *, skip: int = 0) -> dict[str, float]:
    """Median seconds per node from an onnxruntime profile, ignoring each node's first ``skip`` runs.

    Only ``names`` count: nodes inside If/Loop bodies are part of their parent's time.
    """
    wanted = set(names)
    runs: dict[str, list[float]] = {}
    for event in _events(trace):
        name = str(event.get("name", ""))
        node = name.removesuffix(_KERNEL)
        if event.get("cat") == "Node" and name.endswith(_KERNEL) and node in wanted:
            runs.setdefault(node, []).append(float(event.get("dur", 0)) * 1e-6)
    return {node: _median_after(t, skip) for node, t in runs.items()}


def run_times_from_trace(trace: Any, *, skip: int = 0) -> float:
    """Median seconds of onnxruntime's ``model_run`` after ``skip`` runs; 0 when none recorded."""
    runs = [
        float(e.get("dur", 0)) * 1e-6
        for e in _events(trace)
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    ]
    return _median_after(runs, skip) if runs else 0.0


def _profiled(
    runner: StageRunner, stage: StageModel, env: Mapping[str, Any], level: str, *, save: bool
) -> tuple[dict[str, float], float, onnx.GraphProto | None]:
    """(median kernel seconds per executed node, median run seconds, executed graph or None)."""
    options = runner.options
    with tempfile.TemporaryDirectory(prefix="sharderd-profile-") as folder:
        prefix = Path(folder) / f"stage{stage.index}"
        saved = Path(folder) / f"stage{stage.index}.executed.onnx" if save else None
        try:
            session = runner.create(
                stage, optimization=level, profile_prefix=prefix, save_optimized=saved
            )
        except AttemptFailure:
            if saved is None:
                raise
            saved = None  # a provider that compiles its nodes cannot save the graph: names alone
            session = runner.create(stage, optimization=level, profile_prefix=prefix)
        for _ in range(options.warmup + options.profile_runs):
            runner.run(session, stage, env)
        trace_path = Path(session.session.end_profiling())
        del session
        trace = json.loads(trace_path.read_text(encoding="utf-8"))
        executed = None
        if saved is not None and saved.exists():
            executed = onnx.load(str(saved), load_external_data=False).graph
    names = [node.name for node in executed.node] if executed is not None else stage.node_names
    times = node_times_from_trace(trace, names, skip=options.warmup)
    return times, run_times_from_trace(trace, skip=options.warmup), executed


def _producers_and_readers(
    nodes: Sequence[onnx.NodeProto], offset: int
) -> tuple[dict[str, int], dict[str, list[int]]]:
    produced: dict[str, int] = {}
    read: dict[str, list[int]] = defaultdict(list)
    for k, node in enumerate(nodes):
        for name in node.output:
            if name:
                produced[name] = offset + k
        for name in node.input:
            if name:
                read[name].append(offset + k)
    return produced, read


def _split(seconds: float, weight: np.ndarray) -> np.ndarray:
    """``seconds`` over the entries of ``weight`` in proportion, evenly when they sum to 0."""
    if not len(weight):
        return weight.copy()
    total = float(weight.sum())
    if total > 0:
        return seconds * weight / total
    return np.full(len(weight), seconds / len(weight))


def _named(names: Sequence[str], seconds: np.ndarray) -> dict[str, float]:
    return {name: float(t) for name, t in zip(names, seconds, strict=True)}


def _median_after(times: Sequence[float], skip: int) -> float:
    return float(np.median(times[min(skip, len(times) - 1) :]))


def _events(trace: Any) -> list[dict[str, Any]]:
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in events if isinstance(e, dict)]
