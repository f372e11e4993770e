"""Corrections that follow contents: the factors, the corrected analysis and the planner under them,
on real exports."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from real_exports import export_analysis

from sharderd.errors import NotProvenError
from sharderd.graph.analyze import Analysis
from sharderd.job.codec import decode_content
from sharderd.plan.content import ContentCorrection, corrected_analysis, node_factors
from sharderd.plan.observations import stage_contents
from sharderd.plan.ordered_costs import ordered_costs
from sharderd.plan.planner import plan_stages
from sharderd.target import BUILTIN_TARGETS

TARGET = BUILTIN_TARGETS["ipu-mk2"]


def _tight(analysis: Analysis, devices: int):
    """A target whose devices hold ~1.3 × an even share of the model: memory decides the split."""
    first = plan_stages(analysis, TARGET, devices, safety_margin=1.0)
    need = max(s.memory_bytes for s in first.stages)
    return TARGET.__class__(**{**asdict(TARGET), "memory_bytes": int(need * 1.3)})


def test_factors_measured_set_and_overflows_raise() -> None:
    c = ContentCorrection(
        1.2, patches=((((0, 4),), 2.0), (((2, 6),), 1.5)), measured=((((3, 8),), 0.7),)
    )
    f = node_factors(c, 10)
    assert f.tolist() == [2.0, 2.0, 2.0, 2.0, 1.5, 1.5, 0.7, 0.7, 1.2, 1.2]
    assert ContentCorrection().identity and not c.identity
    again = decode_content(json.loads(json.dumps(asdict(c))))
    assert again == c


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_bert", "tiny_efficientnet"])
def test_a_stage_of_corrected_nodes_holds_its_factor_times_its_bytes(name: str) -> None:
    """Every tensor and weight a corrected node touches grows by at least its factor, so the stage
    that held those nodes needs code + factor × the rest, whatever order it is read in."""
    analysis = export_analysis(name)
    plan = plan_stages(analysis, TARGET, 4, safety_margin=1.0)
    runs = stage_contents(plan.assignment, 4)
    factor = 1.7
    content = ContentCorrection(1.0, ((runs[1], factor),))
    grown = corrected_analysis(analysis, content, TARGET.memory_bytes)
    before = ordered_costs(analysis, TARGET, plan.order)
    after = ordered_costs(grown, TARGET, plan.order)
    a, b = plan.bounds[1], plan.bounds[2]
    weights, live, code = before.stage_memory(a, b)
    w2, l2, c2 = after.stage_memory(a, b)
    assert c2 == code and w2 >= factor * weights - 1 and l2 >= factor * live - 1
    for s in (0, 2, 3):  # other stages grow only by tensors they share with stage 1
        lo, hi = plan.bounds[s], plan.bounds[s + 1]
        assert sum(after.stage_memory(lo, hi)) >= sum(before.stage_memory(lo, hi))


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_vit"])
def test_planning_under_contents_moves_them_and_reports_the_original_bytes(name: str) -> None:
    analysis = export_analysis(name)
    target = _tight(analysis, 4)
    plain = plan_stages(analysis, target, 4, safety_margin=1.0)
    heavy = max(range(4), key=lambda s: plain.stages[s].memory_bytes)
    runs = tuple(map(tuple, stage_contents(plain.assignment, 4)[heavy]))
    # A factor that overfills the heavy stage by a fifth (code is not scaled by contents).
    stage = plain.stages[heavy]
    grows = stage.memory_bytes - stage.code_bytes
    factor = max(1.6, 1.2 * (target.memory_bytes - stage.code_bytes) / grows)
    content = ContentCorrection(1.0, ((runs, factor),))
    plan = plan_stages(analysis, target, 4, safety_margin=1.0, content=content)
    assert plan.digest != plain.digest and not plan.proven_optimal
    assert "corrected by compiles" in plan.claim
    # Times and bytes are the original model's for the chosen split ...
    oc = ordered_costs(analysis, target, plan.order)
    for s, stage in enumerate(plan.stages):
        a, b = plan.bounds[s], plan.bounds[s + 1]
        assert stage.memory_bytes == sum(oc.stage_memory(a, b))
        assert abs(stage.time_s - oc.stage_time(a, b)) < 1e-15
        # ... and each stage's effective scale keeps it within the device at the corrected size.
        assert stage.memory_bytes * plan.memory_scale[s] <= target.memory_bytes * (1 + 1e-9)
    grown = corrected_analysis(analysis, content, target.memory_bytes)
    og = ordered_costs(grown, target, plan.order)
    for s in range(4):
        assert sum(og.stage_memory(plan.bounds[s], plan.bounds[s + 1])) <= target.memory_bytes


def test_a_node_too_large_under_the_correction_says_so() -> None:
    analysis = export_analysis("tiny_gpt2")
    target = _tight(analysis, 4)
    everything = ((((0, analysis.flow.num_nodes),), 50.0),)
    with pytest.raises(NotProvenError) as caught:
        plan_stages(
            analysis, target, 4, safety_margin=1.0, content=ContentCorrection(1.0, everything)
        )
    err = caught.value
    assert "memory corrections learned from compiles" in err.message
    assert err.node is not None and err.node_need > 1.0 and err.min_devices is None
