"""A rewrite priced without writing it (shard/serialize_price.py) is the analysis of the rewrite
written: on wide_head and the real gpt_decoder export (column pieces, the bottleneck rewrite), an
embedding and a tiny GPT-2 export (row pieces, the too-big rewrite), a MatMul behind a custom op
(pieces of unknown size), at fp32 and fp16, the graph, every cost, the folding, the aliases and the
plan are equal."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.config.schema import Config
from sharderd.engine import analyze_file, annotated_model, make_plan
from sharderd.errors import SharderdError
from sharderd.graph.analyze import Analysis
from sharderd.shard.serialize import serialize_node
from sharderd.shard.serialize_price import priced
from sharderd.shard.write import write_model

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())


def _export(name: str) -> tuple[Path, PlanConfig]:
    shapes = {k: tuple(v) for k, v in MANIFEST[name]["ort_input_shapes"].items()}
    return MODELS / MANIFEST[name]["path"], PlanConfig(input_shapes=shapes, name_nodes=True)


def _embedding(tmp_path: Path) -> tuple[Path, PlanConfig]:
    """ids → Gather over a [1000, 64] table → MatMul → Relu."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((1000, 64)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="/embed/Gather", axis=0),
        helper.make_node("MatMul", ["e", "w"], ["h"], name="/proj/MatMul"),
        helper.make_node("Relu", ["h"], ["y"], name="/relu"),
    ]
    graph = helper.make_graph(
        nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])], [table, w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return examples.save(model, tmp_path / "embed.onnx"), PlanConfig()


def _written(path: Path, config: PlanConfig, cut: list[tuple[str, int]], tmp: Path) -> Analysis:
    model = onnx.load(path, load_external_data=False)
    for n, (name, pieces) in enumerate(cut):
        data = tmp / f"pieces{n}.data"
        model, _ = serialize_node(model, name, pieces, base_dir=path.parent, data_path=data)
    out = tmp / "written.onnx"
    write_model(model, out)
    return analyze_file(out, config)


def _graph_facts(a: Analysis) -> dict[str, object]:
    """Everything the planner reads, by name (weight and tensor ids may differ)."""
    f, c = a.flow, a.costs
    names, tensors, weights = f.node_names, f.tensor_names, f.weight_names
    alias = a.alias_source if a.alias_source is not None else np.full(f.num_tensors, -1)
    return {
        "nodes": list(zip(names, f.op_types, c.flops.tolist(), a.compiled.tolist(), strict=True)),
        "tensors": [
            (
                tensors[t],
                int(c.tensor_bytes[t]),
                bool(f.is_graph_output[t]),
                names[f.producer[t]] if f.producer[t] >= 0 else None,
                [names[q] for q in f.consumers(t)],
                tensors[alias[t]] if alias[t] >= 0 else None,
            )
            for t in range(f.num_tensors)
        ],
        "reads": [[tensors[t] for t in f.inputs(q)] for q in range(f.num_nodes)],
        "writes": [[tensors[t] for t in f.outputs(q)] for q in range(f.num_nodes)],
        "weights": [
            sorted(
                (weights[w], int(f.weight_bytes[w]), int(f.weight_types[w])) for w in f.weights(q)
            )
            for q in range(f.num_nodes)
        ],
        "order": [names[q] for q in f.topo_order],
        "weight_bytes": a.total_weight_bytes,
        "unknown": c.unknown_tensors,
        "defaults": dict(c.default_cost_ops),
        "types": {t: a.shapes.types.get(t) for t in tensors},
    }


def _after_a_custom_op(tmp_path: Path) -> tuple[Path, PlanConfig]:
    """x → a custom op no inference sizes → MatMul with a [64, 256] weight → Relu."""
    w = numpy_helper.from_array(np.ones((64, 256), np.float32), "w")
    nodes = [
        helper.make_node("Mystery", ["x"], ["m"], name="/mystery", domain="com.example"),
        helper.make_node("MatMul", ["m", "w"], ["h"], name="/proj/MatMul"),
        helper.make_node("Relu", ["h"], ["y"], name="/relu"),
    ]
    graph = helper.make_graph(
        nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return examples.save(model, tmp_path / "custom.onnx"), PlanConfig()


CASES = {
    "wide_head": ("cpu", 4, [("MatMul_head", 4)]),
    "gpt_decoder": ("cpu", 8, [("/MatMul", 2)]),
    "embedding": ("ipu-mk2", 2, [("/embed/Gather", 3), ("/proj/MatMul", 2)]),
    "tiny_gpt2": ("ipu-mk2", 4, [("/m/transformer/wte/Gather", 3), ("/m/lm_head/MatMul", 2)]),
    "after_a_custom_op": ("cpu", 2, [("/proj/MatMul", 2)]),
}


@pytest.mark.parametrize("precision", ["model", "fp16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_priced_rewrite_is_the_analysis_of_the_written_one(
    tmp_path: Path, name: str, precision: str
) -> None:
    target, devices, cut = CASES[name]
    if name == "wide_head":
        path, config = examples.save(examples.wide_head(), tmp_path / "wide.onnx"), PlanConfig()
    elif name == "embedding":
        path, config = _embedding(tmp_path)
    elif name == "after_a_custom_op":
        path, config = _after_a_custom_op(tmp_path)
    else:
        path, config = _export(name)
    config = replace(config, precision=precision)
    whole = analyze_file(path, config)
    price, records = priced(whole, cut)
    written = _written(path, config, cut, tmp_path)
    assert [(r.node, r.pieces) for r in records] == cut
    assert price.priced and not written.priced
    assert _graph_facts(price) == _graph_facts(written)
    tgt = Config().target(target)
    mine, theirs = make_plan(price, tgt, devices, config), make_plan(written, tgt, devices, config)
    assert mine.bottleneck_s == theirs.bottleneck_s
    assert mine.lower_bound_s == theirs.lower_bound_s
    assert mine.assignment.tolist() == theirs.assignment.tolist()
    assert [s.memory_bytes for s in mine.stages] == [s.memory_bytes for s in theirs.stages]


def test_pricing_writes_nothing_and_a_priced_analysis_is_never_written(tmp_path: Path) -> None:
    path = examples.save(examples.wide_head(), tmp_path / "wide.onnx")
    before = sorted(p.name for p in tmp_path.iterdir())
    price, _ = priced(analyze_file(path, PlanConfig()), [("MatMul_head", 4)])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    plan = make_plan(price, Config().target("cpu"), 4, PlanConfig())
    with pytest.raises(SharderdError, match="priced rewrite"):
        annotated_model(price, plan)
