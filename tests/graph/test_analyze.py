"""Validation and analysis of real files: names, cycles, dangling inputs, opsets, symbolic dims and
what counts as a weight (shared initializers once, Constant values, If branches)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd import examples
from sharderd.cli import main as cli_main
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file
from sharderd.errors import DimsUnresolvedError, ModelInvalidError

F = TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)


def _analysis_error(path: Path, config: PlanConfig | None = None) -> ModelInvalidError:
    with pytest.raises(ModelInvalidError) as info:
        analyze_file(path, config or PlanConfig())
    return info.value


def _plan_json(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli_main(["plan", str(path), "--devices", "1", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


# --- node names -------------------------------------------------------------------------------------


def test_unnamed_nodes_are_listed_with_a_name_nodes_hint(model_path: Callable[..., Path]) -> None:
    """Unnamed nodes are an error listing the first five (index, op, output) and how many more."""
    path = model_path("transformer", name_nodes=False)
    model = onnx.load(str(path), load_external_data=False)
    err = _analysis_error(path)
    message = str(err)
    first = model.graph.node[0]
    assert f"#0 ({first.op_type} -> {first.output[0]})" in message
    assert f"#4 ({model.graph.node[4].op_type}" in message
    assert "#5 (" not in message
    assert f"{len(model.graph.node)} node(s) have no name" in message
    assert f"and {len(model.graph.node) - 5} more" in message
    assert "--name-nodes" in message


def test_duplicate_names_are_listed(model_path: Callable[..., Path]) -> None:
    """Names used twice are listed by name; an empty one by index; the hint names --name-nodes."""
    model = examples.shared_weights(layers=3, hidden=8)
    model.graph.node[1].name = model.graph.node[0].name
    model.graph.node[4].name = model.graph.node[3].name
    model.graph.node[5].name = ""
    path = model_path(model)
    message = str(_analysis_error(path))
    assert repr(model.graph.node[0].name) in message and repr(model.graph.node[3].name) in message
    assert "2 name(s) are used by several nodes" in message
    assert f"#5 ({model.graph.node[5].op_type}" in message
    assert "--name-nodes" in message


def test_name_nodes_gives_unique_optype_names_without_clashing(
    model_path: Callable[..., Path], shard: Callable[..., Any]
) -> None:
    """--name-nodes names unnamed/duplicate nodes <OpType>_<k>, skips taken names, keeps named ones."""
    model = examples.shared_weights(layers=4, hidden=8, name_nodes=False)
    nodes = model.graph.node
    nodes[2].name = "MatMul_0"  # a Relu already carries the name a renamed MatMul would get first
    nodes[3].name = "Relu_1"
    nodes[4].name = "/dup"
    nodes[5].name = "/dup"
    original = [(n.name, n.op_type) for n in nodes]
    path = model_path(model)
    result = shard(path, 2, "--name-nodes")
    names = [n.name for n in result.model.graph.node if not n.name.startswith("sharderd/route/")]
    assert len(names) == len(original)
    assert len(set(names)) == len(names) and all(names)
    renamed = 0
    for k, ((old, op), new) in enumerate(zip(original, names, strict=True)):
        if old and (old != "/dup" or k == 4):
            assert new == old, f"node {k} lost its name {old!r}"
        else:
            assert re.fullmatch(rf"{op}_\d+", new), new
            renamed += 1
    # MatMul_0 and Relu_1 are taken, so the counters skip them
    assert (names[0], names[6], names[9]) == ("MatMul_1", "MatMul_2", "MatMul_3")
    assert (names[5], names[8]) == ("Relu_0", "Relu_2")
    assert names.count("MatMul_0") == 1 and names[2] == "MatMul_0"
    assert names.count("Relu_1") == 1 and names[3] == "Relu_1"
    assert (
        result.report["model"]["renamed_nodes"]
        == renamed
        == sum(1 for n, _ in original if not n) + 1
    )
    assert any("renamed" in w for w in result.report["warnings"])


def test_name_nodes_counts_renamed_in_the_analysis(model_path: Callable[..., Path]) -> None:
    """PlanConfig(name_nodes=True) renames every unnamed node and reports how many."""
    path = model_path("cnn", name_nodes=False)
    count = len(onnx.load(str(path)).graph.node)
    analysis = analyze_file(path, PlanConfig(name_nodes=True))
    assert analysis.renamed_nodes == count
    assert len(set(analysis.flow.node_names)) == count
    assert all(
        re.fullmatch(rf"{op}_\d+", name)
        for name, op in zip(analysis.flow.node_names, analysis.flow.op_types, strict=True)
    )


# --- graph structure -----------------------------------------------------------------------------


def test_cycle_is_refused(model_path: Callable[..., Path]) -> None:
    """Two nodes feeding each other are a cycle error naming them."""
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="cycA"),
        helper.make_node("Relu", ["a"], ["b"], name="cycB"),
        helper.make_node("Relu", ["a"], ["y"], name="out"),
    ]
    path = model_path(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", F, [2])],
            [helper.make_tensor_value_info("y", F, [2])],
        )
    )
    message = str(_analysis_error(path))
    assert "cycle" in message and "cycA" in message and "cycB" in message


def test_dangling_input_is_refused(model_path: Callable[..., Path]) -> None:
    """A node reading a tensor nobody provides is an error naming the node and the tensor."""
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    path = model_path(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", F, [2])],
            [helper.make_tensor_value_info("y", F, [2])],
        )
    )
    message = str(_analysis_error(path))
    assert "dangling" in message and "'adder'" in message and "'ghost'" in message


def test_tensor_produced_twice_is_refused(model_path: Callable[..., Path]) -> None:
    """Two nodes writing the same tensor are an error naming the tensor."""
    nodes = [
        helper.make_node("Relu", ["x"], ["t"], name="one"),
        helper.make_node("Neg", ["x"], ["t"], name="two"),
        helper.make_node("Relu", ["t"], ["y"], name="three"),
    ]
    path = model_path(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", F, [2])],
            [helper.make_tensor_value_info("y", F, [2])],
        )
    )
    message = str(_analysis_error(path))
    assert "'t'" in message and "twice" in message


@pytest.mark.parametrize("version", [3, 99])
def test_unsupported_opset_is_refused(model_path: Callable[..., Path], version: int) -> None:
    """A default-domain opset too old or newer than onnx knows is refused, naming the version."""
    model = examples.shared_weights(layers=3, hidden=8)
    model.opset_import[0].version = version
    message = str(_analysis_error(model_path(model)))
    assert f"opset {version}" in message and "supports" in message


def test_model_without_default_opset_is_refused(model_path: Callable[..., Path]) -> None:
    """A model importing only a custom domain has no default opset: refused."""
    model = examples.shared_weights(layers=3, hidden=8)
    model.opset_import[0].domain = "com.example"
    message = str(_analysis_error(model_path(model)))
    assert "default-domain opset" in message


# --- symbolic dims ----------------------------------------------------------------------------------


def _symbolic_model() -> onnx.ModelProto:
    """x[batch, seq, 16] @ W[16, 16]: one dim the batch size fixes, one only [plan.dims] can."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", F, ["batch", "seq", 16])],
        [_weight("W", 16, 16)],
    )


def test_symbolic_dims_resolve_from_batch_size_and_named_dims(
    model_path: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`batch` takes --batch-size, `seq` takes [plan.dims]; activation sizes follow; nothing unresolved."""
    config = tmp_path / "sharderd.toml"
    config.write_text("[plan]\ndims = { seq = 5 }\n")
    report = _plan_json(
        model_path(_symbolic_model()), capsys, "--batch-size", "3", "--config", str(config)
    )
    assert report["model"]["resolved_dims"] == {"batch": 3, "seq": 5}
    assert report["model"]["unresolved_dims"] == []
    assert report["model"]["unknown_size_tensors"] == 0
    assert not any("symbolic" in w for w in report["warnings"])
    # x streamed in and y produced are both 3·5·16 floats; the stage holds both
    assert report["plan"]["stages"][0]["activation_bytes"] == 2 * 3 * 5 * 16 * 4
    assert report["model"]["flops"] == 2 * 3 * 5 * 16 * 16


def test_named_dim_wins_over_batch_size_on_the_leading_axis(
    model_path: Callable[..., Path],
) -> None:
    """A leading dim named in [plan.dims] takes that value, not batch_size."""
    analysis = analyze_file(
        model_path(_symbolic_model()), PlanConfig(batch_size=3, dims={"batch": 7, "seq": 2})
    )
    assert dict(analysis.shapes.resolved_dims) == {"batch": 7, "seq": 2}
    y = analysis.flow.tensor_names.index("y")
    assert analysis.costs.tensor_bytes[y] == 7 * 2 * 16 * 4


def test_unresolved_symbolic_dim_is_exit_2_before_planning(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a value for `seq` nothing is planned: exit 2 naming input, axis and dim, with the flag
    and the config/sidecar line that set it; the flag as printed then plans."""
    path = model_path(_symbolic_model())
    assert cli_main(["plan", str(path), "--devices", "1", "--json"]) == 2
    err = capsys.readouterr().err
    assert "input 'x' axis 1 ('seq')" in err
    assert "--dim seq=<size>" in err
    assert "dims = { seq = <size> }" in err
    assert capsys.readouterr().out == ""
    report = _plan_json(path, capsys, "--dim", "seq=16")
    assert report["model"]["resolved_dims"] == {"batch": 1, "seq": 16}
    assert report["model"]["unresolved_dims"] == []
    assert report["model"]["unknown_size_tensors"] == 0


def test_anonymous_dim_hint_names_the_input_shape_flag(model_path: Callable[..., Path]) -> None:
    model = _symbolic_model()
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.Clear()  # neither a value nor a name
    with pytest.raises(DimsUnresolvedError) as info:
        analyze_file(model_path(model), PlanConfig())
    assert info.value.dims == (("x", 1, ""),)
    assert "--input-shape x=1,<size>,16" in str(info.value)
    assert "input_shapes = { x = [1, <size>, 16] }" in str(info.value)
    analysis = analyze_file(model_path(model), PlanConfig(input_shapes={"x": (1, 8, 16)}))
    assert analysis.shapes.input_shapes["x"] == (1, 8, 16)
    assert not analysis.costs.unknown_tensors


# --- weights ------------------------------------------------------------------------------------------


def _initializer_bytes(model: onnx.ModelProto) -> dict[str, int]:
    return {
        t.name: int(np.prod(t.dims, dtype=np.int64))
        * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in model.graph.initializer
    }


def test_shared_initializer_is_one_weight_used_by_several_nodes(
    model_path: Callable[..., Path],
) -> None:
    """W_shared has one weight id, read by the three MatMuls; total weights count it once."""
    path = model_path("shared_weights")
    model = onnx.load(str(path), load_external_data=False)
    analysis = analyze_file(path, PlanConfig())
    flow = analysis.flow
    assert flow.weight_names.count("W_shared") == 1
    shared = flow.weight_names.index("W_shared")
    users = [
        flow.node_names[n] for n in range(flow.num_nodes) if shared in flow.weights(n).tolist()
    ]
    assert users == ["/layer0/MatMul", "/layer3/MatMul", "/layer5/MatMul"]
    assert analysis.total_weight_bytes == sum(_initializer_bytes(model).values())


def test_constant_node_values_count_as_weights(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A Constant node's tensor counts in the model's weight bytes once, as a weight of the node that
    reads it (the compiler places constants with their readers); the Constant itself costs nothing."""
    value = numpy_helper.from_array(np.ones((32, 8), np.float32), "c")
    nodes = [
        helper.make_node("Constant", [], ["W"], name="const", value=value),
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 32])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        [_weight("b", 8)],
    )
    path = model_path(model)
    report = _plan_json(path, capsys)
    assert report["model"]["weight_bytes"] == 32 * 8 * 4 + 8 * 4
    analysis = analyze_file(path, PlanConfig())
    flow = analysis.flow
    const, mm = flow.node_names.index("const"), flow.node_names.index("mm")
    assert flow.weights(const).tolist() == []
    assert flow.weight_bytes[flow.weights(mm)].tolist() == [32 * 8 * 4]
    assert analysis.folded_nodes == 1
    assert analysis.costs.tensor_bytes[flow.tensor_names.index("W")] == 0  # never crosses a cut


def test_if_branch_weights_count(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """with_if: the then-branch Constant and the else-branch initializer are weights of the If node."""
    path = model_path("with_if")
    model = onnx.load(str(path), load_external_data=False)
    top = sum(_initializer_bytes(model).values())
    square = 16 * 16 * 4
    report = _plan_json(path, capsys)
    assert report["model"]["weight_bytes"] == top + 2 * square
    flow = analyze_file(path, PlanConfig()).flow
    if_node = flow.node_names.index("/if/If")
    assert flow.weight_bytes[flow.weights(if_node)].tolist() == [square, square]


def test_outer_scope_reads_of_if_bodies_are_node_inputs(model_path: Callable[..., Path]) -> None:
    """The If node reads /pre/MatMul_output_0 only inside its branches; the dataflow makes it an input."""
    flow = analyze_file(model_path("with_if"), PlanConfig()).flow
    if_node = flow.node_names.index("/if/If")
    inputs = {flow.tensor_names[t] for t in flow.inputs(if_node)}
    assert inputs == {"/pre/Greater_output_0", "/pre/MatMul_output_0"}
    produced = flow.tensor_names.index("/pre/MatMul_output_0")
    assert if_node in flow.consumers(produced).tolist()


def test_outer_initializer_read_in_a_branch_shares_the_weight_id(
    model_path: Callable[..., Path],
) -> None:
    """A top-level initializer read both by a node and inside an If branch is one weight for both."""
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"], name="then_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2, 8])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [2, 8])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="cond"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info("y", F, [2, 8])],
        [_weight("W", 8, 8), numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    flow = analyze_file(model_path(model), PlanConfig()).flow
    w = flow.weight_names.index("W")
    assert w in flow.weights(flow.node_names.index("mm")).tolist()
    assert w in flow.weights(flow.node_names.index("if")).tolist()
    assert flow.weight_names.count("W") == 1
    assert "x" in {flow.tensor_names[t] for t in flow.inputs(flow.node_names.index("if"))}


def test_a_dim_name_takes_one_value_across_inputs(model_path: Callable[..., Path]) -> None:
    """`batch` leads x and is axis 1 of m: once batch_size fixes it, both inputs have that size."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Transpose", ["m"], ["mt"], name="tr", perm=[1, 0]),
        helper.make_node("Add", ["h", "mt"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", F, ["batch", 16]),
            helper.make_tensor_value_info("m", F, [16, "batch"]),
        ],
        [helper.make_tensor_value_info("y", F, ["batch", 16])],
        [_weight("W", 16, 16)],
    )
    analysis = analyze_file(model_path(model), PlanConfig(batch_size=4))
    assert dict(analysis.shapes.resolved_dims) == {"batch": 4}
    assert analysis.shapes.unresolved_dims == ()
    m = analysis.flow.tensor_names.index("m")
    assert analysis.costs.tensor_bytes[m] == 4 * 16 * 4
