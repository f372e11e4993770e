"""Serialize a node whose own cost holds the bottleneck up, when re-planning shows it pays.

``serialize_for_devices`` first rewrites the nodes too big for a device (``serialize_file``), then
analyses the model. When ``plan.serialize_choice.bottleneck_pieces`` names nodes (their own cost is
over every other term of the lower bound on ``devices``), it plans the model as it is, rewrites
those nodes into pieces, analyses and plans the copy, and keeps it only when ``worth_keeping``
(the predicted bottleneck is lower by more than ``BOTTLENECK_GAIN``). A plan that fails on either
side (no split, the least overfull one) keeps the graph as it is, and the copy's files are removed.
Nodes already cut because they were too big keep their pieces.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sharderd.config import Config, PlanConfig
from sharderd.engine import analyze_file, make_plan
from sharderd.errors import SharderdError
from sharderd.filenames import safe_name
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import node_work
from sharderd.plan.ordered_costs import calibrated_compute_s
from sharderd.plan.serialize_choice import bottleneck_pieces, worth_keeping
from sharderd.shard.serialize import (
    Serialized,
    max_pieces,
    serialize_node,
    splittable,
    weight_input,
)
from sharderd.shard.serialize_file import serialize_file
from sharderd.shard.write import copy_external_data, write_model
from sharderd.target import Target

__all__ = ["SerializedModel", "serialize_for_devices", "serialized_for_plan"]


@dataclass(frozen=True, slots=True)
class SerializedModel:
    path: Path
    """The model to plan: the user's file, or the serialized copy."""
    records: tuple[Serialized, ...]
    analysis: Analysis | None
    """The analysis of ``path`` made while deciding (the caller's to reuse), or None."""
    tried: tuple[dict[str, int], float, float] | None = None
    """When a bottleneck rewrite was planned, kept or not: the pieces asked for (node → k) and the
    first plan's bottleneck before and after (seconds)."""


def serialize_for_devices(
    path: Path, config: PlanConfig, target: Target, devices: int, work_dir: Path
) -> SerializedModel:
    """The model to plan on ``devices`` and every rewrite made to it (see module doc)."""
    first, records = serialize_file(path, config, target, work_dir)
    analysis = analyze_file(first, config)
    if devices < 1:
        return SerializedModel(first, records, analysis)
    cut = {name for r in records for name in r.piece_nodes}
    work = node_work(analysis, target, calibrated_compute_s(analysis, target, None))
    limits = _limits(analysis, work.node_s > work.total_s / devices, cut)
    chosen = bottleneck_pieces(work.node_s, work.total_s, devices, limits)
    before = _bottleneck(analysis, target, devices, config) if chosen else None
    if before is None:
        return SerializedModel(first, records, analysis)
    if first.parent != work_dir:
        work_dir.mkdir(parents=True, exist_ok=True)
        copy_external_data(analysis.loaded.external_files, first.parent, work_dir, link=True)
    model, done, written = analysis.model, [], []
    for n, (i, pieces) in enumerate(sorted(chosen.items())):
        written.append(work_dir / f"{safe_name(path.stem)}.bottleneck{n}.data")
        name = analysis.flow.node_names[i]
        model, record = serialize_node(
            model, name, pieces, base_dir=first.parent, data_path=written[-1]
        )
        done.append(record)
    out = work_dir / f"{safe_name(path.stem)}.bottleneck.onnx"
    write_model(model, out)
    written.append(out)
    serialized = analyze_file(out, config)
    after = _bottleneck(serialized, target, devices, config)
    tried = ({r.node: r.pieces for r in done}, before, np.inf if after is None else after)
    if after is None or not worth_keeping(before, after):
        for file in written:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        return SerializedModel(first, records, analysis, tried)
    why = tuple(replace(r, reason="bottleneck", bottleneck_s=(before, after)) for r in done)
    return SerializedModel(out, records + why, serialized, tried)


def _limits(analysis: Analysis, dear: np.ndarray, cut: set[str]) -> np.ndarray:
    """How many pieces each ``dear`` node can be cut into (0: not splittable, cut already, or
    cheap enough that it cannot hold the bound up)."""
    limits = np.zeros(analysis.flow.num_nodes, dtype=np.int64)
    model = analysis.model
    by_name = {n.name: n for n in model.graph.node}
    inits = {t.name: t for t in model.graph.initializer}
    for i in np.flatnonzero(dear):
        name = analysis.flow.node_names[i]
        node = by_name.get(name)
        if node is None or name in cut:
            continue
        if splittable(model, node) == "columns":  # row pieces each still gather every index
            limits[i] = max_pieces(node, "columns", inits[weight_input(node, "columns")])
    return limits


def _bottleneck(
    analysis: Analysis, target: Target, devices: int, config: PlanConfig
) -> float | None:
    """The first plan's predicted bottleneck (as a job's first plan), or None when none fits."""
    try:
        plan = make_plan(analysis, target, devices, config)
    except SharderdError:
        return None
    return None if plan.method == "overfull" else plan.bottleneck_s


@contextmanager
def serialized_for_plan(
    path: Path, config: Config, target_name: str | None, devices: int
) -> Iterator[SerializedModel]:
    """``serialize_for_devices`` into a temporary directory (``sharderd plan``, which writes
    nothing), or ``path`` itself, not analysed, when ``[plan] serialize`` is off."""
    if not config.plan.serialize:
        yield SerializedModel(path, (), None)
        return
    with tempfile.TemporaryDirectory(prefix="sharderd-serialize-") as tmp:
        target = config.target(target_name)
        yield serialize_for_devices(path, config.plan, target, devices, Path(tmp))
