"""One node as a standalone model: valid ONNX at the planned static shapes, and the same numbers
as that node computes inside the whole model (real exports, and a model with external data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from real_exports import MANIFEST, MODELS, export_analysis

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import memory_floor
from sharderd.shard.node_model import node_model, write_node_model
from sharderd.target import BUILTIN_TARGETS

TARGET = BUILTIN_TARGETS["ipu-mk2"]


def _inputs(name: str) -> dict[str, np.ndarray]:
    entry = MANIFEST[name]
    session = ort.InferenceSession(str(MODELS / entry["path"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for value in session.get_inputs():
        shape = entry["ort_input_shapes"][value.name]
        if "int" in value.type:
            feeds[value.name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _inside(path: Path, names: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the whole model computes for ``names`` (graph outputs added for them)."""
    model = onnx.load(str(path))
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds), strict=True))


def _check_alone(analysis: Analysis, node: int, path: Path, feeds: dict[str, np.ndarray]) -> None:
    alone = node_model(analysis, node)
    onnx.checker.check_model(alone, full_check=True)
    target = analysis.model.graph.node[node]
    assert alone.graph.node[-1].name == target.name
    for value in alone.graph.input:
        dims = value.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), value.name
    names = [v.name for v in alone.graph.input] + list(target.output)
    inside = _inside(path, names, feeds)
    session = ort.InferenceSession(alone.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(list(target.output), {v.name: inside[v.name] for v in alone.graph.input})
    for name, value in zip(target.output, got, strict=True):
        np.testing.assert_allclose(value, inside[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny_gpt2", "tiny_bert", "tiny_efficientnet", "tiny_vit"])
def test_the_heaviest_node_alone_computes_what_it_computes_inside(name: str) -> None:
    analysis = export_analysis(name)
    heaviest = int(np.argmax(memory_floor(analysis, TARGET).node_bytes))
    _check_alone(analysis, heaviest, MODELS / MANIFEST[name]["path"], _inputs(name))


def test_constant_operands_stay_constants() -> None:
    """A Reshape whose shape a Constant node gives keeps that Constant, so the shape is static."""
    analysis = export_analysis("tiny_gpt2")
    graph = analysis.model.graph
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    node = next(
        k for k, n in enumerate(graph.node) if n.op_type == "Reshape" and n.input[1] in constants
    )
    alone = node_model(analysis, node)
    assert [n.op_type for n in alone.graph.node] == ["Constant", "Reshape"]
    assert [v.name for v in alone.graph.input] == [graph.node[node].input[0]]
    _check_alone(analysis, node, MODELS / MANIFEST["tiny_gpt2"]["path"], _inputs("tiny_gpt2"))


def test_external_weights_are_inlined_from_their_file(tmp_path: Path) -> None:
    """Only the node's own weights are read, from the data file, into the probe model."""
    source = tmp_path / "cnn.onnx"
    model = examples.cnn(blocks=3, channels=16)
    onnx.save_model(
        model, str(source), save_as_external_data=True, location="cnn.data", size_threshold=0
    )
    analysis = analyze_file(source, PlanConfig())
    conv = next(k for k, n in enumerate(analysis.model.graph.node) if n.op_type == "Conv")
    path = write_node_model(analysis, conv, tmp_path / "probe" / "node.onnx")
    alone = onnx.load(str(path))
    assert list((tmp_path / "probe").iterdir()) == [path]
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in alone.graph.initializer}
    original = {
        t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(source)).graph.initializer
    }
    assert weights and set(weights) <= set(original)
    for name, value in weights.items():
        np.testing.assert_array_equal(value, original[name])
