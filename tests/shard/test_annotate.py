"""The written ``<stem>.sharded.onnx`` and ``<stem>.sharding.yaml`` obey PopART's pipelining rules,
checked from the files themselves, and differ from the input only by annotations and routed inputs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR, check_annotation

MODELS = ["transformer", "cnn", "shared_weights", "with_if", "multi_io", "chain"]
ROUTE_PREFIX = "sharderd/route/"


# --- reading the file ------------------------------------------------------------------------------


def _bodies(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _body_nodes(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    for body in _bodies(node):
        for inner in body.node:
            yield inner
            yield from _body_nodes(inner)


def _int_attrs(node: onnx.NodeProto) -> dict[str, int]:
    found = {}
    for attr in node.attribute:
        if attr.name in (IPU_ATTR, STAGE_ATTR):
            assert attr.type == onnx.AttributeProto.INT, f"{node.name}: {attr.name} is not INT"
            found[attr.name] = attr.i
    return found


def _stage(node: onnx.NodeProto) -> int:
    attrs = _int_attrs(node)
    assert set(attrs) == {IPU_ATTR, STAGE_ATTR}, f"node {node.name!r} lacks an annotation"
    assert attrs[IPU_ATTR] == attrs[STAGE_ATTR], f"node {node.name!r}: device != stage"
    return attrs[STAGE_ATTR]


def _reads(node: onnx.NodeProto) -> set[str]:
    """Every name a node reads, from its own inputs or from inside its bodies (outer scope included)."""
    names = {x for x in node.input if x}
    for inner in _body_nodes(node):
        names.update(x for x in inner.input if x)
    return names


def _check_pipeline_rules(model: onnx.ModelProto, devices: int) -> dict[str, int]:
    """Assert PopART's rules from the file alone; return node name → stage."""
    graph = model.graph
    stage_of = {node.name: _stage(node) for node in graph.node}
    assert len(stage_of) == len(graph.node), "node names are not unique"
    assert sorted(set(stage_of.values())) == list(range(devices)), (
        "stages are not 0..N-1 without gaps"
    )
    producer_stage = {out: stage_of[node.name] for node in graph.node for out in node.output}
    inputs = {v.name for v in graph.input} - {t.name for t in graph.initializer}
    input_stages: dict[str, set[int]] = {name: set() for name in inputs}
    for node in graph.node:
        stage = stage_of[node.name]
        for name in _reads(node):
            if name in producer_stage:
                assert producer_stage[name] <= stage, (
                    f"{name!r} flows back from {producer_stage[name]} to {stage}"
                )
            if name in input_stages:
                input_stages[name].add(stage)
        for inner in _body_nodes(node):
            assert _stage(inner) == stage, (
                f"{inner.name!r} inside {node.name!r} is not on its stage"
            )
    for name, used in input_stages.items():
        assert len(used) <= 1, f"graph input {name!r} is read on stages {sorted(used)}"
    return stage_of


def _parse_sharding_yaml(text: str) -> list[dict[str, Any]]:
    """The tiny YAML subset sharderd writes: a list of ``{node: "<json>", device: int, stage: int}``."""
    entries: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("- "):
            entries.append({})
            line = "  " + line[2:]
        assert line.startswith("  ") and entries, f"unexpected YAML line {line!r}"
        key, sep, value = line.strip().partition(": ")
        assert sep and key not in entries[-1], f"bad YAML line {line!r}"
        entries[-1][key] = json.loads(value)
    return entries


# --- the rules on every example ----------------------------------------------------------------------


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("kind", MODELS)
def test_written_model_obeys_pipeline_rules(
    kind: str, devices: int, model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """Every node has equal INT device/stage, stages 0..N-1, no backward edge, inputs on one device."""
    result = shard(model_path(kind), devices)
    _check_pipeline_rules(result.model, devices)
    assert check_annotation(result.model) == []


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("kind", MODELS)
def test_yaml_matches_the_model_attributes(
    kind: str, devices: int, model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """The sharding YAML lists every top-level node once with device == stage == its attribute."""
    result = shard(model_path(kind), devices)
    entries = _parse_sharding_yaml(result.yaml_text)
    assert all(set(e) == {"node", "device", "stage"} for e in entries)
    names = [e["node"] for e in entries]
    assert sorted(names) == sorted(n.name for n in result.model.graph.node)
    assert len(set(names)) == len(names)
    stages = {n.name: _stage(n) for n in result.model.graph.node}
    for entry in entries:
        assert entry["device"] == entry["stage"] == stages[entry["node"]], entry


# --- graph inputs read on several stages ------------------------------------------------------------


def test_attention_mask_is_routed_through_one_identity(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """The mask read by every layer enters on its first stage through one Identity; later stages read it."""
    path = model_path("transformer", layers=4)
    original = onnx.load(str(path), load_external_data=False)
    # Every op priced alike, so the split follows the layers and each stage reads the mask (with
    # views free and MatMul dearer, the level order wins and puts all four mask Casts on stage 0).
    uniform = ", ".join(f"{op} = 65536" for op in ("MatMul", "Gemm", "Reshape"))
    config = path.parent / "uniform.toml"
    config.write_text(
        '[target]\nname = "uniform"\n[targets.uniform]\nbase = "ipu-mk2"\n'
        f"code_bytes_by_op = {{ {uniform} }}\n"
        "op_overhead_s_by_op = { MatMul = 1e-6, Gemm = 1e-6, Reshape = 1e-6 }\n"
    )
    result = shard(path, 4, "--config", str(config))
    graph = result.model.graph
    stage_of = _check_pipeline_rules(result.model, 4)

    identities = [
        n for n in graph.node if n.op_type == "Identity" and list(n.input) == ["attention_mask"]
    ]
    assert len(identities) == 1
    route = identities[0]
    routed = route.output[0]
    readers = [n for n in graph.node if "attention_mask" in n.input and n is not route]
    later = [n for n in graph.node if routed in n.input]
    assert readers and later, "the mask should be read both directly and through the route"
    first = stage_of[route.name]
    assert {stage_of[n.name] for n in readers} == {first}
    assert all(stage_of[n.name] > first for n in later)
    # every original reader of the mask reads it one way or the other
    original_readers = [n.name for n in original.graph.node if "attention_mask" in n.input]
    assert sorted(n.name for n in readers + later) == sorted(original_readers)
    assert first == min(stage_of[name] for name in original_readers)

    listed = result.report["plan"]["routed_inputs"]
    assert listed == [
        {
            "input": "attention_mask",
            "stages": sorted({stage_of[name] for name in original_readers}),
            "node": route.name,
            "output": routed,
        }
    ]
    assert "`attention_mask`" in (result.out / "report.md").read_text()


def test_input_read_on_one_stage_is_not_routed(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """A plan on one device routes nothing: no Identity is added and the report lists none."""
    path = model_path("transformer")
    result = shard(path, 1)
    assert not any(n.name.startswith(ROUTE_PREFIX) for n in result.model.graph.node)
    assert result.report["plan"]["routed_inputs"] == []
    assert len(result.model.graph.node) == len(onnx.load(str(path)).graph.node)


def _if_reads_input_model() -> onnx.ModelProto:
    """x feeds a MatMul chain and is read again, only inside an If branch, at the very end."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(0)

    def weight(name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), name)

    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W_then"], ["t"], name="then_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("t", f, [2, 8])],
    )
    other = helper.make_graph(
        [helper.make_node("Add", ["x", "h2"], ["e"], name="else_add")],
        "else",
        [],
        [helper.make_tensor_value_info("e", f, [2, 8])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("MatMul", ["h0", "W1"], ["h1"], name="mm1"),
        helper.make_node("MatMul", ["h1", "W2"], ["h2"], name="mm2"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="cond"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "if_reads_input",
        [helper.make_tensor_value_info("x", f, [2, 8])],
        [helper.make_tensor_value_info("y", f, [2, 8])],
        [
            weight("W0"),
            weight("W1"),
            weight("W2"),
            weight("W_then"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_input_read_inside_an_if_body_is_routed(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """A graph input read on a later stage only inside an If branch: the branch reads the routed name."""
    path = model_path(_if_reads_input_model())
    result = shard(path, 3)
    stage_of = _check_pipeline_rules(result.model, 3)
    graph = result.model.graph
    if_node = next(n for n in graph.node if n.op_type == "If")
    assert stage_of["if"] > stage_of["mm0"]
    route = next(n for n in graph.node if n.name.startswith(ROUTE_PREFIX))
    # on the first stage that reads x directly (the planner may put the ReduceSum before mm0)
    assert list(route.input) == ["x"] and stage_of[route.name] == min(
        stage_of["mm0"], stage_of["sum"]
    )
    inner_reads = {x for inner in _body_nodes(if_node) for x in inner.input}
    assert route.output[0] in inner_reads and "x" not in inner_reads
    for x in (np.full((2, 8), 0.5, np.float32), np.full((2, 8), -0.5, np.float32)):  # both branches
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        sharded = str(result.out / f"{path.stem}.sharded.onnx")
        got = ort.InferenceSession(sharded, providers=["CPUExecutionProvider"]).run(None, {"x": x})[
            0
        ]
        np.testing.assert_array_equal(got, expected)


# --- nothing else changes -----------------------------------------------------------------------------


def _strip(node: onnx.NodeProto, renames: dict[str, str]) -> bytes:
    """A node without its annotations and with routed names mapped back, nested bodies included."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    _strip_in_place(copy, renames)
    return copy.SerializeToString(deterministic=True)


def _strip_in_place(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    keep = [a for a in node.attribute if a.name not in (IPU_ATTR, STAGE_ATTR)]
    del node.attribute[:]
    node.attribute.extend(keep)
    for k, name in enumerate(node.input):
        node.input[k] = renames.get(name, name)
    for body in _bodies(node):
        for inner in body.node:
            _strip_in_place(inner, renames)


@pytest.mark.parametrize(
    ("kind", "devices"), [("transformer", 3), ("with_if", 3), ("multi_io", 4), ("cnn", 3)]
)
def test_only_annotations_and_routes_are_added(
    kind: str, devices: int, model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """Same initializers, inputs, outputs, opsets; node list = original + routed Identities, in order."""
    path = model_path(kind, external_data=True)
    original = onnx.load(str(path), load_external_data=False)
    result = shard(path, devices)
    sharded = result.model
    routes = [n for n in sharded.graph.node if n.name.startswith(ROUTE_PREFIX)]
    assert len(routes) == len(result.report["plan"]["routed_inputs"])
    assert all(n.op_type == "Identity" for n in routes)
    renames = {n.output[0]: n.input[0] for n in routes}
    rest = [n for n in sharded.graph.node if not n.name.startswith(ROUTE_PREFIX)]
    assert len(sharded.graph.node) == len(original.graph.node) + len(routes)
    assert [n.op_type for n in rest] == [n.op_type for n in original.graph.node]
    assert [_strip(n, renames) for n in rest] == [_strip(n, {}) for n in original.graph.node]

    def ser(items: Any) -> list[bytes]:
        return [x.SerializeToString(deterministic=True) for x in items]

    assert ser(sharded.graph.initializer) == ser(original.graph.initializer)
    # inputs and outputs are the same but for symbolic dims, now the planned static sizes
    assert ser(map(_static_copy, sharded.graph.input, original.graph.input)) == ser(
        sharded.graph.input
    )
    assert ser(map(_static_copy, sharded.graph.output, original.graph.output)) == ser(
        sharded.graph.output
    )
    assert ser(sharded.opset_import) == ser(original.opset_import)
    assert sharded.ir_version == original.ir_version
    # external references are kept as they were, and the data file is copied beside the model
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in sharded.graph.initializer)
    data = path.with_name(f"{kind}.data")
    assert (result.out / data.name).read_bytes() == data.read_bytes()


def _static_copy(
    written: onnx.ValueInfoProto, original: onnx.ValueInfoProto
) -> onnx.ValueInfoProto:
    """``original`` with each symbolic dim set to the size ``written`` has there (fixed dims must agree)."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(original)
    dims = copy.type.tensor_type.shape.dim
    for dim, size in zip(dims, written.type.tensor_type.shape.dim, strict=True):
        if dim.HasField("dim_value"):
            assert dim.dim_value == size.dim_value
        else:
            dim.dim_value = size.dim_value
    return copy


def test_if_body_nodes_carry_their_if_stage(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """Nodes inside both If branches carry the If node's device and stage."""
    result = shard(model_path("with_if"), 4)
    node = next(n for n in result.model.graph.node if n.op_type == "If")
    inner = list(_body_nodes(node))
    assert {n.op_type for n in inner} >= {"Constant", "MatMul", "Relu", "Tanh"}
    stage = _stage(node)
    assert all(_int_attrs(n) == {IPU_ATTR: stage, STAGE_ATTR: stage} for n in inner)
    # the branches read /pre/MatMul_output_0 from the outer scope: its producer is not on a later stage
    producer = next(n for n in result.model.graph.node if "/pre/MatMul_output_0" in n.output)
    assert _stage(producer) <= stage


# --- check_annotation catches violations ----------------------------------------------------------


def _set(node: onnx.NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value


@pytest.fixture
def sharded_chain(model_path: Callable[..., Path], shard: Callable[..., Any]) -> onnx.ModelProto:
    model = shard(model_path("chain"), 3).model
    assert check_annotation(model) == []
    return model


def test_check_annotation_finds_a_backward_edge(sharded_chain: onnx.ModelProto) -> None:
    """Moving the last node to stage 0 makes its input flow backwards: reported."""
    last = sharded_chain.graph.node[-1]
    _set(last, IPU_ATTR, 0)
    _set(last, STAGE_ATTR, 0)
    problems = check_annotation(sharded_chain)
    assert any("goes back" in p and last.name in p for p in problems), problems


def test_check_annotation_finds_a_stage_gap(sharded_chain: onnx.ModelProto) -> None:
    """Renumbering the last stage from 2 to 3 leaves stage 2 empty: reported."""
    for node in sharded_chain.graph.node:
        if _stage(node) == 2:
            _set(node, IPU_ATTR, 3)
            _set(node, STAGE_ATTR, 3)
    problems = check_annotation(sharded_chain)
    assert any("without gaps" in p for p in problems), problems


def test_check_annotation_finds_a_mixed_annotation(sharded_chain: onnx.ModelProto) -> None:
    """A node whose device differs from its stage is reported."""
    node = sharded_chain.graph.node[0]
    _set(node, IPU_ATTR, 1)
    problems = check_annotation(sharded_chain)
    assert any(node.name in p and "one device per stage" in p for p in problems), problems


def test_check_annotation_finds_a_missing_annotation(sharded_chain: onnx.ModelProto) -> None:
    """A node without the attributes is reported by name."""
    node = sharded_chain.graph.node[1]
    del node.attribute[:]
    problems = check_annotation(sharded_chain)
    assert any(node.name in p and "lacks" in p for p in problems), problems


def test_check_annotation_finds_an_input_on_two_devices(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """Undoing the mask's route makes a graph input read on several devices: reported."""
    model = shard(model_path("transformer"), 3).model
    route = next(n for n in model.graph.node if n.name.startswith(ROUTE_PREFIX))
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name == route.output[0]:
                node.input[k] = route.input[0]
    model.graph.node.remove(route)
    problems = check_annotation(model)
    assert any("'attention_mask'" in p and "several devices" in p for p in problems), problems
