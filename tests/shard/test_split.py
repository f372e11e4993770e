"""split_stages/write_stages on real example models annotated by the engine.

Every stage must be a valid ONNX model by itself; together the stages must hold every node once,
pass exactly the tensors that cross stage boundaries, and carry each weight only where it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file, annotated_model, make_plan
from sharderd.errors import ModelInvalidError
from sharderd.graph.dataflow import body_outer_references, build_dataflow
from sharderd.graph.in_file import in_file_tensors
from sharderd.shard.annotate import STAGE_ATTR, annotate
from sharderd.shard.split import (
    ANNOTATIONS,
    StageModel,
    external_locations,
    split_stages,
    write_stages,
)
from sharderd.target import BUILTIN_TARGETS

CASES = [
    ("transformer", 3),
    ("cnn", 4),
    ("multi_io", 3),
    ("shared_weights", 3),
    ("with_if", 3),
]
"""Example and devices; each split cuts through something awkward (routed inputs, skips, If)."""


def planned(path: Path, devices: int, config: PlanConfig | None = None) -> onnx.ModelProto:
    """The engine's annotated model for ``devices`` CPU stages, its inline weights read in (the
    engine holds large ones as references into the file, for its writers: ``graph.in_file``)."""
    config = config or PlanConfig()
    analysis = analyze_file(path, config)
    plan = make_plan(analysis, BUILTIN_TARGETS["cpu"], devices, config)
    model, _ = annotated_model(analysis, plan)
    for tensor, where in list(in_file_tensors(model)):
        with open(where.source, "rb") as f:
            f.seek(where.offset)
            tensor.raw_data = f.read(where.length)
        tensor.ClearField("data_location")
        del tensor.external_data[:]
    return model


def by_hand(model: onnx.ModelProto, stage_of: Callable[[onnx.NodeProto], int]) -> onnx.ModelProto:
    """``model`` annotated with ``stage_of(node)`` for every top-level node."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assignment = np.array([stage_of(node) for node in copy.graph.node], dtype=np.int64)
    annotate(copy, build_dataflow(copy.graph), assignment)
    return copy


def walk(graph: onnx.GraphProto) -> Iterator[tuple[onnx.GraphProto, onnx.NodeProto]]:
    for node in graph.node:
        yield graph, node
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from walk(body)


def node_reads(node: onnx.NodeProto) -> set[str]:
    return {x for x in node.input if x} | set(body_outer_references(node))


def run_stages(stages: list[StageModel], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feeds)
    for stage in stages:
        session = ort.InferenceSession(stage.model.SerializeToString())
        values = session.run(list(stage.outputs), {name: env[name] for name in stage.inputs})
        env.update(zip(stage.outputs, values, strict=True))
    return env


@pytest.mark.parametrize(("kind", "devices"), CASES)
def test_every_stage_passes_the_checker_and_holds_its_annotated_nodes(
    model_path: Callable[..., Path], kind: str, devices: int
) -> None:
    """Each stage is a checker-clean, unannotated model holding exactly the nodes annotated with its index."""
    model = planned(model_path(kind), devices)
    stages = split_stages(model, Path())
    assert [s.index for s in stages] == list(range(devices))
    annotated = {
        node.name: next(a.i for a in node.attribute if a.name == STAGE_ATTR)
        for node in model.graph.node
    }
    seen: dict[str, int] = {}
    for stage in stages:
        onnx.checker.check_model(stage.model, full_check=True)
        # onnxruntime's fusions copy them onto fused nodes and then refuse the model
        assert not [
            a for _, n in walk(stage.model.graph) for a in n.attribute if a.name in ANNOTATIONS
        ]
        for name in stage.node_names:
            assert name not in seen
            seen[name] = stage.index
    assert seen == annotated


@pytest.mark.parametrize(("kind", "devices"), CASES)
def test_boundaries_carry_exactly_the_crossing_tensors(
    model_path: Callable[..., Path], kind: str, devices: int
) -> None:
    """Inputs are earlier outputs or graph inputs read here; outputs are read later or are graph outputs."""
    model = planned(model_path(kind), devices)
    stages = split_stages(model, Path())
    graph_inputs = {i.name for i in model.graph.input}
    graph_outputs = {o.name for o in model.graph.output}
    produced_by: dict[str, int] = {}
    read_by: dict[str, set[int]] = {}
    for stage in stages:
        for node in stage.model.graph.node:
            produced_by.update((o, stage.index) for o in node.output)
            for name in node_reads(node):
                read_by.setdefault(name, set()).add(stage.index)
    for stage in stages:
        local = {o for node in stage.model.graph.node for o in node.output}
        expected_in = {
            name
            for name, readers in read_by.items()
            if stage.index in readers
            and name not in local
            and (name in graph_inputs or name in produced_by)
        }
        assert set(stage.inputs) == expected_in
        assert all(name in graph_inputs or produced_by[name] < stage.index for name in stage.inputs)
        expected_out = {
            name
            for name in local
            if name in graph_outputs or max(read_by.get(name, {-1})) > stage.index
        }
        assert set(stage.outputs) == expected_out
        assert [v.name for v in stage.model.graph.input] == list(stage.inputs)
        assert [v.name for v in stage.model.graph.output] == list(stage.outputs)
    assert {o for s in stages for o in s.outputs} >= graph_outputs


@pytest.mark.parametrize(("kind", "devices"), CASES)
def test_initializers_are_copied_only_into_stages_that_read_them(
    model_path: Callable[..., Path], kind: str, devices: int
) -> None:
    """A stage's initializers are exactly the model's initializers its nodes (and bodies) read."""
    model = planned(model_path(kind), devices)
    weights = {t.name for t in model.graph.initializer}
    for stage in split_stages(model, Path()):
        reads = set().union(*(node_reads(node) for node in stage.model.graph.node))
        assert {t.name for t in stage.model.graph.initializer} == reads & weights


def test_a_shared_weight_goes_to_every_stage_that_uses_it(model_path: Callable[..., Path]) -> None:
    """W_shared (layers 0, 3 and 5) is copied into each stage holding one of those layers, once."""
    model = planned(model_path("shared_weights"), 3)
    stages = split_stages(model, Path())
    users = {s.index for s in stages for node in s.model.graph.node if "W_shared" in node.input}
    assert len(users) >= 2
    for stage in stages:
        names = [t.name for t in stage.model.graph.initializer]
        assert names.count("W_shared") == (1 if stage.index in users else 0)


def test_if_bodies_pull_outer_scope_tensors_and_weights_into_their_stage() -> None:
    """An If whose branches read an activation and a top-level weight implicitly gets both."""
    hidden = 4
    then_body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W_outer"], ["t"], name="then/MatMul")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, hidden])],
    )
    else_body = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e"], name="else/Neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, hidden])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
        helper.make_node(
            "If", ["c"], ["y"], name="if", then_branch=then_body, else_branch=else_body
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hidden])],
        [
            numpy_helper.from_array(np.eye(hidden, dtype=np.float32) * 2, "W_outer"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    stages = split_stages(by_hand(model, lambda n: int(n.op_type == "If")), Path())
    assert stages[1].inputs == ("c", "h")
    assert [t.name for t in stages[1].model.graph.initializer] == ["W_outer"]
    assert [t.name for t in stages[0].model.graph.initializer] == ["zero"]
    for stage in stages:
        onnx.checker.check_model(stage.model, full_check=True)
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    assert np.array_equal(run_stages(stages, {"x": x})["y"], np.maximum(x, 0) * 2)


def test_symbolic_dims_stay_symbolic_at_stage_boundaries(model_path: Callable[..., Path]) -> None:
    """With keep_dynamic, a tensor crossing stages keeps the model's named batch dim, so any batch
    size runs."""
    model = planned(model_path("transformer"), 3, PlanConfig(keep_dynamic=True))
    stages = split_stages(model, Path())
    inner = [
        v
        for s in stages[1:]
        for v in s.model.graph.input
        if not v.name.startswith(("input_ids", "attention"))
    ]
    assert inner
    for value in inner:
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"


def test_planned_shapes_are_written_static(model_path: Callable[..., Path]) -> None:
    """By default the sharded model and every stage carry the planned static shapes (PopRT compiles
    static shapes only)."""
    model = planned(model_path("transformer"), 3, PlanConfig(batch_size=4))
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims) and dims[0].dim_value == 4
    for stage in split_stages(model, Path()):
        for value in (*stage.model.graph.input, *stage.model.graph.output):
            assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim), (
                value.name
            )


def test_stages_compute_what_the_model_computes(model_path: Callable[..., Path]) -> None:
    """Running the multi_io stages in order reproduces all three outputs of the whole model."""
    path = model_path("multi_io")
    stages = split_stages(planned(path, 3), path.parent)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 16)).astype(np.float32) for n in ("a", "b")}
    expected = ort.InferenceSession(str(path)).run(None, feeds)
    got = run_stages(stages, feeds)
    for name, value in zip(("out_sum", "out_prod", "out_deep"), expected, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def test_external_tensors_keep_their_references(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """Split without loading weights: stage initializers still point into the model's data file."""
    path = model_path("transformer", external_data=True)
    stages = split_stages(planned(path, 3), path.parent)
    external = [
        t
        for s in stages
        for t in s.model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    ]
    assert len(external) > 10
    assert all(not t.raw_data for t in external)
    assert {loc for s in stages for loc in external_locations(s.model)} == {"transformer.data"}


def test_written_stages_load_by_path_with_their_data(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """Stage files written elsewhere get a real copy of the data file and run in onnxruntime."""
    path = model_path("with_if", external_data=True)
    stages = split_stages(planned(path, 3), path.parent)
    paths = write_stages(stages, tmp_path / "stages", stem="with_if")
    assert [p.name for p in paths] == [f"with_if.stage{i}.onnx" for i in range(3)]
    data = tmp_path / "stages" / "with_if.data"
    assert data.read_bytes() == (path.parent / "with_if.data").read_bytes()
    assert data.stat().st_nlink == 1 and not data.is_symlink()
    feeds = {"x": np.full((2, 16), 0.3, np.float32)}
    env = dict(feeds)
    for stage, stage_path in zip(stages, paths, strict=True):
        onnx.checker.check_model(str(stage_path), full_check=True)
        session = ort.InferenceSession(str(stage_path))
        env.update(
            zip(
                stage.outputs,
                session.run(list(stage.outputs), {n: env[n] for n in stage.inputs}),
                strict=True,
            )
        )
    expected = ort.InferenceSession(str(path)).run(None, feeds)[0]
    np.testing.assert_allclose(env["y"], expected, rtol=1e-5, atol=1e-6)


def test_writing_beside_the_model_copies_no_data(model_path: Callable[..., Path]) -> None:
    """Stages written into the model's own folder reuse its data file untouched."""
    path = model_path("shared_weights", external_data=True)
    data = path.parent / "shared_weights.data"
    before = data.stat()
    write_stages(split_stages(planned(path, 3), path.parent), path.parent)
    after = data.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_model_over_2_gb_splits_without_reading_weights(tmp_path: Path) -> None:
    """A 2.2 GB external model splits into checker-clean stages that reference its data file."""
    path = examples.large_external_model(tmp_path / "big.onnx", total_bytes=2_200_000_000)
    model = planned(path, 3)
    stages = split_stages(model, path.parent)
    assert len(stages) == 3
    for stage, stage_path in zip(stages, write_stages(stages, path.parent), strict=True):
        onnx.checker.check_model(str(stage_path))  # by path: it opens the data file it references
        assert all(t.data_location == TensorProto.EXTERNAL for t in stage.model.graph.initializer)
        assert stage.model.ByteSize() < 64 * 1024
    assert sum(len(s.model.graph.initializer) for s in stages) == 8


def test_an_unannotated_model_is_one_stage() -> None:
    """Without annotations the whole model is stage 0, with the graph's inputs and outputs."""
    model = examples.multi_io(hidden=8)
    (stage,) = split_stages(model, Path())
    assert set(stage.inputs) == {"a", "b"}
    assert stage.outputs == ("out_sum", "out_prod", "out_deep")


def test_a_backward_edge_is_refused() -> None:
    """A node reading a tensor from a later stage makes the split fail, naming both."""
    model = by_hand(examples.shared_weights(hidden=8), lambda n: 0)
    model.graph.node[0].attribute[-1].i = 1  # the first MatMul claims stage 1
    with pytest.raises(
        ModelInvalidError, match=r"/layer0/Add.*reads '/layer0/MatMul_output_0'.*later stage 1"
    ):
        split_stages(model, Path())


def test_a_partial_annotation_is_refused() -> None:
    """Some nodes annotated and some not is an error naming the bare nodes."""
    model = by_hand(examples.shared_weights(hidden=8), lambda n: 0)
    del model.graph.node[2].attribute[:]
    with pytest.raises(ModelInvalidError, match="/layer0/Relu"):
        split_stages(model, Path())
