"""serialize_bottleneck.decide: the floor no split of the graph in pieces beats (checked against
the plans in pieces it lets through and against literal numbers at its edge), a rewrite left
unplanned only when that floor rules it out, and the plan made while deciding handed back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.config.schema import Config
from sharderd.engine import analyze_file, make_plan
from sharderd.plan.serialize_choice import floor_in_pieces, worth_keeping
from sharderd.shard.serialize_bottleneck import _floor, decide
from sharderd.shard.serialize_price import priced

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())


def test_the_floor_is_the_join_s_own_cost_plus_each_piece_or_its_copy() -> None:
    # c: pieces 0, 1 (3 µs and 9 µs), join 2 (10 µs); outputs of 4 kB over a 1 GB/s link (4 µs)
    node_s = np.array([3e-6, 9e-6, 10e-6])
    join = (2, np.array([0, 1]), np.array([4000, 4000]))
    assert floor_in_pieces(node_s, 1e9, 0.0, [join]) == pytest.approx(10e-6 + 3e-6 + 4e-6)
    assert floor_in_pieces(node_s, 1e9, 20e-6, [join]) == 20e-6  # the lower bound is higher
    assert floor_in_pieces(node_s, 1e9, 1e-6, []) == 1e-6


def test_a_floor_just_outside_the_gain_leaves_the_rewrite_unplanned() -> None:
    # before 2 ms: a floor of 1.801 ms cannot be 10% lower, 1.799 ms might
    assert not worth_keeping(2.0e-3, 1.801e-3)
    assert worth_keeping(2.0e-3, 1.799e-3)


def _export(name: str) -> tuple[Path, PlanConfig]:
    shapes = {k: tuple(v) for k, v in MANIFEST[name]["ort_input_shapes"].items()}
    return MODELS / MANIFEST[name]["path"], PlanConfig(input_shapes=shapes, name_nodes=True)


CASES = [
    ("wide_head", "cpu", 4, [("MatMul_head", 4)]),
    ("wide_head", "ipu-mk2", 8, [("MatMul_head", 2)]),
    ("gpt_decoder", "cpu", 8, [("/MatMul", 2)]),
    ("gpt_decoder", "ipu-mk2", 8, [("/MatMul", 3)]),
    ("tiny_gpt2", "ipu-mk2", 8, [("/m/lm_head/MatMul", 2)]),
    ("tiny_gpt2_kv", "cpu", 8, [("/model/lm_head/MatMul", 2)]),
]


@pytest.mark.parametrize(("name", "target", "devices", "cut"), CASES)
def test_no_plan_in_pieces_beats_the_floor(
    tmp_path: Path, name: str, target: str, devices: int, cut: list[tuple[str, int]]
) -> None:
    if name == "wide_head":
        path, config = examples.save(examples.wide_head(), tmp_path / "w.onnx"), PlanConfig()
    else:
        path, config = _export(name)
    tgt = Config().target(target)
    pieces, records = priced(analyze_file(path, config), cut)
    floor = _floor(pieces, tgt, devices, records)
    for margin in (1.0, config.safety_margin):
        plan = make_plan(pieces, tgt, devices, replace(config, safety_margin=margin))
        assert plan.bottleneck_s >= floor * (1 - 1e-12)
        assert plan.lower_bound_s <= floor


def test_decide_hands_back_the_plan_it_made_and_prices_without_writing(tmp_path: Path) -> None:
    path = examples.save(examples.wide_head(), tmp_path / "w.onnx")
    config, cpu = PlanConfig(), Config().target("cpu")
    whole = analyze_file(path, config)
    kept = decide(whole, config, cpu, 4)
    assert kept.trial is not None and kept.trial.kept and kept.trial.planned
    assert kept.analysis.priced and kept.plan is not None
    assert kept.plan.bottleneck_s == make_plan(kept.analysis, cpu, 4, config).bottleneck_s
    assert [r.reason for r in kept.records] == ["bottleneck"]
    slow = replace(cpu, name="slow-links", link_bytes_per_s=1e8)
    left = decide(whole, config, slow, 4)
    assert left.trial is not None and not left.trial.kept and left.records == ()
    assert left.analysis is whole and left.plan is not None
    assert left.plan.bottleneck_s == make_plan(whole, slow, 4, config).bottleneck_s
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.onnx"]
