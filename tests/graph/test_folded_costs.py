"""Folded nodes (constant expressions) are planned as the compiler runs them: not at all.

``folded_nodes`` is checked against a count written independently of graph/folding.py
(``graph_oracle.constant_outputs``): a fixpoint over the ONNX graph itself (a node is a constant expression when every input it names is
an initializer or a constant's output, or it is Shape/Size of a tensor whose shape is static).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from sharderd.config import load_config
from sharderd.plan.op_costs import node_code_bytes, node_overhead_s
from sharderd.plan.planner import plan_stages
from sharderd.report.build import model_facts, plan_section, report_dict
from sharderd.report.html import render_html
from sharderd.report.markdown import render_markdown
from sharderd.target import BUILTIN_TARGETS
from tests.graph_oracle import constant_outputs
from tests.real_exports import MANIFEST, export_analysis

TARGET = BUILTIN_TARGETS["ipu-mk2"]


def _topological(model: onnx.ModelProto) -> bool:
    seen = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    for node in model.graph.node:
        if not all(name in seen for name in node.input if name):
            return False
        seen.update(node.output)
    return True


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_folded_nodes_match_an_independent_count(name: str) -> None:
    analysis = export_analysis(name)
    assert _topological(analysis.model)
    static = {n for n, tt in analysis.shapes.types.items() if tt.shape is not None}
    assert analysis.folded_nodes == len(constant_outputs(analysis.model, static))
    assert analysis.compiled_ops == analysis.flow.num_nodes - analysis.folded_nodes


NEW_EXPORTS = ["window_attention", "unet_attn64", "gpt_decoder", "bert_encoder"]
"""The pure-torch exports of issue #27's architecture kinds (bench/export_models.py)."""


@pytest.mark.parametrize("name", ["tiny_bert", *NEW_EXPORTS])
def test_no_overhead_or_code_for_a_folded_node(name: str) -> None:
    analysis = export_analysis(name)
    assert analysis.folded_nodes > 100
    folded = ~analysis.compiled
    assert not node_overhead_s(analysis, TARGET)[folded].any()
    assert not node_code_bytes(analysis, TARGET)[folded].any()
    plan = plan_stages(analysis, TARGET, 2, safety_margin=1.0)
    code = sum(stage.code_bytes for stage in plan.stages)
    overhead = sum(stage.overhead_s for stage in plan.stages)
    assert code == int(node_code_bytes(analysis, TARGET).sum())
    assert overhead == pytest.approx(float(node_overhead_s(analysis, TARGET).sum()))
    compiled = np.flatnonzero(analysis.compiled)
    assert code == sum(TARGET.code_bytes_for(analysis.flow.op_types[q]) for q in compiled)


def test_costs_by_op_type_follow_the_rule_and_the_config_tables(tmp_path) -> None:
    assert TARGET.code_bytes_for("Reshape") == 0 and TARGET.op_overhead_for("Identity") == 0
    assert TARGET.code_bytes_for("MatMul") == 3 * TARGET.code_bytes_for("Add") > 0
    assert TARGET.code_bytes_for("Add") == TARGET.code_bytes_per_node
    path = tmp_path / "sharderd.toml"
    path.write_text(
        '[target]\nname = "mine"\n[targets.mine]\nbase = "ipu-mk2"\ncode_bytes_per_node = 1000\n'
        "code_bytes_by_op = { MatMul = 7, Reshape = 5 }\nop_overhead_s_by_op = { Add = 2e-6 }\n"
    )
    mine = load_config(path).target()
    assert mine.code_bytes_for("Add") == 1000  # the old key is the default row
    assert mine.code_bytes_for("Gemm") == 3000 and mine.code_bytes_for("Squeeze") == 0
    assert mine.code_bytes_for("MatMul") == 7 and mine.code_bytes_for("Reshape") == 5
    assert mine.op_overhead_for("Add") == 2e-6
    assert mine.op_overhead_for("Mul") == TARGET.op_overhead_s
    assert mine.code_table()["MatMul"] == 7 and "overhead" not in mine.code_table()


@pytest.mark.parametrize("name", ["tiny_gpt2", *NEW_EXPORTS])
def test_the_report_counts_compiled_ops_per_stage_and_lists_the_tables(name: str) -> None:
    analysis = export_analysis(name)
    plan = plan_stages(analysis, TARGET, 3, safety_margin=1.0)
    model = model_facts(analysis)
    report = report_dict(
        model=model,
        warnings=(),
        target=TARGET,
        plan=plan_section(plan, 1),
        batch_size=1,
        status="planned",
    )
    stages = report["plan"]["stages"]
    assert sum(s["ops"] for s in stages) == model["compiled_ops"] < model["nodes"]
    assert model["compiled_ops"] == model["nodes"] - model["folded_nodes"]
    for s, stage in zip(stages, plan.stages, strict=True):
        members = plan.order[stage.start : stage.stop]
        assert s["ops"] == int(analysis.compiled[members].sum()) <= s["num_nodes"]
    tables = {k: v for k, v in report["target"].items() if isinstance(v, dict) and v}
    assert {"op_overhead_s_table", "code_bytes_table"} <= set(tables)
    assert report["target"]["code_bytes_table"]["MatMul"] == TARGET.code_bytes_for("MatMul")
    phrase = (
        f"{model['nodes']} nodes in the file, {model['folded_nodes']} folded, "
        f"{model['compiled_ops']} ops compiled"
    )
    assert phrase in render_markdown(report) and phrase in render_html(report)
