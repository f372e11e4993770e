"""Each stage's available_memory_proportion in report.json and report.md (PopRT compiles)."""

from __future__ import annotations

from pathlib import Path

from sharderd.config import PlanConfig
from sharderd.engine import analyze_file, make_plan
from sharderd.report.build import model_facts, plan_section, report_dict
from sharderd.report.markdown import render_markdown
from sharderd.target import BUILTIN_TARGETS

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_bert" / "model.onnx"


def test_stage_amps_are_stage_keys_and_a_report_line() -> None:
    config = PlanConfig(dims={"sequence": 32})
    analysis = analyze_file(MODEL, config)
    target = BUILTIN_TARGETS["ipu-mk2"]
    plan = make_plan(analysis, target, 2, config)

    def report(amps: tuple[float, ...] | None) -> dict:
        return report_dict(
            model=model_facts(analysis),
            warnings=[],
            target=target,
            plan=plan_section(plan, 1, (), amps),
            batch_size=1,
            status="compiled",
            backend="poprt",
        )

    with_amps = report((0.6, 0.3))
    assert [s["available_memory_proportion"] for s in with_amps["plan"]["stages"]] == [0.6, 0.3]
    assert "available_memory_proportion per stage" in render_markdown(with_amps)
    assert "stage 0: 0.6, stage 1: 0.3" in render_markdown(with_amps)
    without = report(None)
    assert all("available_memory_proportion" not in s for s in without["plan"]["stages"])
    assert "available_memory_proportion per stage" not in render_markdown(without)
