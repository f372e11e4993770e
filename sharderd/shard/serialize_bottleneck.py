"""Which nodes a plan on ``devices`` cuts into pieces, decided by pricing; a shard writes what it keeps.

``decide`` is pure: on the analysis of the model as it is, it prices (``serialize_price``) the
nodes too big for one device (``serialize_file.too_big_pieces``; always kept), then, when
``plan.serialize_choice.bottleneck_pieces`` names nodes (their own cost is over every other term
of the lower bound on ``devices``), plans the graph before and with them in pieces and keeps the
pieces only when ``worth_keeping`` (the predicted bottleneck is lower by more than
``BOTTLENECK_GAIN``). A plan that fails on either side (no split, the least overfull one) keeps
the graph as it is. Nodes already cut because they were too big keep their pieces. The plan made
last on the analysis it returns comes back too, so the caller does not plan it again.

``sharderd plan`` and the API plan on that decision: nothing is written. A shard
(``serialize_for_devices``) writes the too-big rewrites before analysing (it keeps every one),
decides the bottleneck rewrite by pricing, and writes and analyses only a kept one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sharderd.config import PlanConfig
from sharderd.engine import analyze_file, make_plan, with_fewest
from sharderd.errors import SharderdError
from sharderd.filenames import safe_name
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import lower_bound_all_splits, node_work
from sharderd.plan.ordered_costs import calibrated_compute_s
from sharderd.plan.serialize_choice import (
    BottleneckTrial,
    JoinInputs,
    bottleneck_pieces,
    floor_in_pieces,
    worth_keeping,
)
from sharderd.plan.types import Plan
from sharderd.shard.serialize import (
    Serialized,
    max_pieces,
    serialize_node,
    splittable,
    weight_input,
)
from sharderd.shard.serialize_file import serialize_file, too_big_pieces
from sharderd.shard.serialize_price import priced
from sharderd.shard.write import copy_external_data, write_model
from sharderd.target import Target

__all__ = ["Decision", "SerializedModel", "decide", "planned", "serialize_for_devices"]


@dataclass(frozen=True, slots=True)
class Decision:
    analysis: Analysis
    """What to plan: the analysis as it is, or priced with every rewrite kept."""
    records: tuple[Serialized, ...]
    """The rewrites kept (too big, then bottleneck)."""
    trial: BottleneckTrial | None = None
    plan: Plan | None = None
    """The first plan of ``analysis`` (the config's margin), when deciding made it."""


def decide(analysis: Analysis, config: PlanConfig, target: Target, devices: int) -> Decision:
    """The rewrites a plan of ``analysis`` on ``devices`` keeps (see module doc); writes nothing."""
    big = too_big_pieces(analysis.model, config, target)
    folded = {analysis.flow.node_names[q] for q in np.flatnonzero(~analysis.compiled)}
    analysis, records = priced(analysis, [(n, k) for n, k in big.items() if n not in folded])
    return _bottleneck(Decision(analysis, records), config, target, devices)


def planned(
    analysis: Analysis, config: PlanConfig, target: Target, devices: int
) -> tuple[Decision, Plan]:
    """What ``sharderd plan`` and the API plan: ``decide`` when ``config.serialize`` (else the
    analysis as it is), and the first plan of the graph decided on (the one deciding made, reused)."""
    chosen = (
        decide(analysis, config, target, devices) if config.serialize else Decision(analysis, ())
    )
    if chosen.plan is None:
        return chosen, make_plan(chosen.analysis, target, devices, config)
    return chosen, with_fewest(chosen.analysis, target, chosen.plan, config)


def _bottleneck(done: Decision, config: PlanConfig, target: Target, devices: int) -> Decision:
    """``done`` with the bottleneck rewrite priced, and kept if it pays."""
    analysis = done.analysis
    if devices < 1:
        return done
    cut = {name for r in done.records for name in r.piece_nodes}
    work = node_work(analysis, target, calibrated_compute_s(analysis, target, None))
    limits = _limits(analysis, work.node_s > work.total_s / devices, cut)
    chosen = bottleneck_pieces(work.node_s, work.total_s, devices, limits)
    if not chosen:
        return done
    before = _first_plan(analysis, target, devices, config)
    if before is None:
        return done
    names = [(analysis.flow.node_names[i], k) for i, k in sorted(chosen.items())]
    after_analysis, records = priced(analysis, names)
    pieces = tuple((r.node, r.op, r.pieces) for r in records)
    floor = _floor(after_analysis, target, devices, records)
    if not worth_keeping(before.bottleneck_s, floor):  # no plan in pieces could be kept
        trial = BottleneckTrial(pieces, before.bottleneck_s, floor, False, None, kept=False)
        return Decision(analysis, done.records, trial, before)
    after = _first_plan(after_analysis, target, devices, config)
    after_s = None if after is None else after.bottleneck_s
    kept = after_s is not None and worth_keeping(before.bottleneck_s, after_s)
    trial = BottleneckTrial(pieces, before.bottleneck_s, floor, True, after_s, kept)
    if not kept:
        return Decision(analysis, done.records, trial, before)
    assert after is not None and after_s is not None
    why = tuple(
        replace(r, reason="bottleneck", bottleneck_s=(before.bottleneck_s, after_s))
        for r in records
    )
    return Decision(after_analysis, done.records + why, trial, after)


def _floor(
    analysis: Analysis, target: Target, devices: int, records: tuple[Serialized, ...]
) -> float:
    """``serialize_choice.floor_in_pieces`` of the priced graph: each rewrite's join is the node
    reading its pieces' outputs."""
    flow = analysis.flow
    compute = calibrated_compute_s(analysis, target, None)
    index = {name: q for q, name in enumerate(flow.node_names)}
    joins: list[JoinInputs] = []
    for record in records:
        producers = np.array([index[name] for name in record.piece_nodes], dtype=np.int64)
        outs = np.array([flow.outputs(q)[0] for q in producers], dtype=np.int64)
        join = int(flow.consumers(int(outs[0]))[0])
        joins.append((join, producers, analysis.costs.tensor_bytes[outs]))
    bound = lower_bound_all_splits(analysis, target, compute, devices)
    node_s = node_work(analysis, target, compute).node_s
    return floor_in_pieces(node_s, target.link_bytes_per_s, bound, joins)


def _limits(analysis: Analysis, dear: np.ndarray, cut: set[str]) -> np.ndarray:
    """How many pieces each ``dear`` node can be cut into (0: not splittable, cut already, or
    cheap enough that it cannot hold the bound up)."""
    limits = np.zeros(analysis.flow.num_nodes, dtype=np.int64)
    model = analysis.model
    by_name = {n.name: n for n in model.graph.node}
    inits = {t.name: t for t in model.graph.initializer}
    compiled = analysis.compiled
    for i in np.flatnonzero(dear & compiled):
        name = analysis.flow.node_names[i]
        node = by_name.get(name)
        if node is None or name in cut:
            continue
        if splittable(model, node, inits) == "columns":  # row pieces each still gather every index
            limits[i] = max_pieces(node, "columns", inits[weight_input(node, "columns")])
    return limits


def _first_plan(
    analysis: Analysis, target: Target, devices: int, config: PlanConfig
) -> Plan | None:
    """The first plan a job makes (the config's margin), or None when none fits."""
    try:
        plan = make_plan(analysis, target, devices, config, fewest=False)
    except SharderdError:
        return None
    return None if plan.method == "overfull" else plan


@dataclass(frozen=True, slots=True)
class SerializedModel:
    path: Path
    """The model a shard plans and writes: the user's file, or the serialized copy."""
    records: tuple[Serialized, ...]
    analysis: Analysis
    """The analysis of ``path``."""
    trial: BottleneckTrial | None = None


def serialize_for_devices(
    path: Path, config: PlanConfig, target: Target, devices: int, work_dir: Path
) -> SerializedModel:
    """A shard's model on ``devices``: the too-big nodes cut and written first, then the bottleneck
    rewrite decided by pricing, written under ``work_dir`` only when kept."""
    first, records = serialize_file(path, config, target, work_dir)
    analysis = analyze_file(first, config)
    done = _bottleneck(Decision(analysis, records), config, target, devices)
    kept = done.records[len(records) :]
    if not kept:
        return SerializedModel(first, records, analysis, done.trial)
    if first.parent != work_dir:
        work_dir.mkdir(parents=True, exist_ok=True)
        copy_external_data(analysis.loaded.external_files, first.parent, work_dir, link=True)
    model = analysis.model
    for n, record in enumerate(kept):
        data = work_dir / f"{safe_name(path.stem)}.bottleneck{n}.data"
        model, _ = serialize_node(
            model, record.node, record.pieces, base_dir=first.parent, data_path=data
        )
    out = work_dir / f"{safe_name(path.stem)}.bottleneck.onnx"
    write_model(model, out)
    return SerializedModel(out, done.records, analyze_file(out, config), done.trial)
