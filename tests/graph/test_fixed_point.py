"""Sizes settled to a fixed point (graph/fixed_point.py): a chain of computed pads in one round, what
only whole-model inference reaches (an ``If`` after a computed pad) in a second, the bound on
rounds, the node that stops propagation named with its reason, and sympy loaded only when a model
needs the symbolic engine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from sharderd.cli import main as cli_main
from sharderd.graph import fixed_point
from sharderd.graph.fixed_point import settle_shapes
from sharderd.graph.input_dims import fix_input_dims
from sharderd.graph.propagate import collect_types, inference_copy, onnx_inference

REPO = Path(__file__).resolve().parents[2]


def _ints(**values: object) -> list[onnx.TensorProto]:
    return [nh.from_array(np.array(v, np.int64), name) for name, v in values.items()]


def _pad_to_four(x: str, prefix: str) -> list[onnx.NodeProto]:
    """``x`` [1, H, 8] padded at the end of H to a multiple of 4, with pads from ``Shape``:
    ``(4 - H % 4) % 4``, as Swin pads a block's input to whole windows."""
    return [
        h.make_node("Shape", [x], [f"{prefix}s"], name=f"{prefix}shape"),
        h.make_node("Gather", [f"{prefix}s", "one"], [f"{prefix}h"], name=f"{prefix}g", axis=0),
        h.make_node("Mod", [f"{prefix}h", "four"], [f"{prefix}m"], name=f"{prefix}m"),
        h.make_node("Sub", ["four", f"{prefix}m"], [f"{prefix}d"], name=f"{prefix}sub"),
        h.make_node("Mod", [f"{prefix}d", "four"], [f"{prefix}p"], name=f"{prefix}p"),
        h.make_node("Unsqueeze", [f"{prefix}p", "ax0"], [f"{prefix}u"], name=f"{prefix}u"),
        h.make_node("Concat", ["z4", f"{prefix}u", "z1"], [f"{prefix}pads"], name=f"{prefix}cat", axis=0),
        h.make_node("Pad", [x, f"{prefix}pads"], [f"{prefix}xp"], name=f"{prefix}pad"),
    ]  # fmt: skip


def _model(nodes: list[onnx.NodeProto], out: str, name: str) -> onnx.ModelProto:
    inits = _ints(one=1, four=4, zero=0, two=[2], ax0=[0], ax1=[1], start=[0], end=[2**62])
    inits += _ints(z4=[0, 0, 0, 0], z1=[0])
    graph = h.make_graph(
        nodes,
        name,
        [h.make_tensor_value_info("x", T.FLOAT, [1, "H", 8])],
        [h.make_tensor_value_info(out, T.FLOAT, None)],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def swin_chain(blocks: int) -> onnx.ModelProto:
    """Each block pads H to a multiple of 4 and keeps every second row: the next block's pads come
    from the shape of this block's padded output, as in a Swin stage after patch merging."""
    nodes, x = [], "x"
    for b in range(blocks):
        nodes += _pad_to_four(x, f"b{b}/")
        nodes.append(
            h.make_node("Slice", [f"b{b}/xp", "start", "end", "ax1", "two"], [f"b{b}/y"], name=f"b{b}/half")
        )  # fmt: skip
        x = f"b{b}/y"
    return _model(nodes, x, "swin_chain")


def if_after_pad() -> onnx.ModelProto:
    """A computed pad, then an ``If`` whose branches read the padded tensor from the outer scope."""

    def branch(name: str, op: str) -> onnx.GraphProto:
        node = h.make_node(op, ["b0/xp"], [f"{name}_y"], name=f"{name}_op")
        return h.make_graph(
            [node], name, [], [h.make_tensor_value_info(f"{name}_y", T.FLOAT, None)]
        )

    nodes = _pad_to_four("x", "b0/")
    nodes += [
        h.make_node("Greater", ["b0/h", "zero"], ["cond"], name="positive"),
        h.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then", "Relu"),
                    else_branch=branch("else", "Neg")),
        h.make_node("Sigmoid", ["y"], ["z"], name="sigmoid"),
    ]  # fmt: skip
    return _model(nodes, "z", "if_after_pad")


def _light(model: onnx.ModelProto, height: int) -> onnx.ModelProto:
    light = inference_copy(model)
    fix_input_dims(
        light.graph, batch_size=1, dims={}, input_shapes={"x": (1, height, 8)}, only={"x"}
    )
    return light


def _run_shapes(model: onnx.ModelProto, height: int) -> dict[str, tuple[int, ...]]:
    """Every node output's shape as onnxruntime computes it."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    names = [o for n in model.graph.node for o in n.output if o]
    exposed.graph.output.extend(h.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((1, height, 8), np.float32)
    return {n: tuple(v.shape) for n, v in zip(names, session.run(names, {"x": x}), strict=True)}


def test_whole_model_inference_stops_at_the_first_computed_pad() -> None:
    types = collect_types(onnx_inference(_light(swin_chain(3), 7)).graph)
    assert types["b0/xp"].shape is None  # so every block after it is unknown too
    assert types["b2/y"].shape is None


@pytest.mark.parametrize("height", [7, 13])
def test_one_sweep_carries_every_block_s_pads_to_the_end(height: int) -> None:
    model = swin_chain(5)
    light = _light(model, height)
    settled = settle_shapes(light, range(len(light.graph.node)))
    assert (settled.rounds, settled.unknown) == (1, 0)
    exact = _run_shapes(model, height)
    assert {n: settled.types[n].shape for n in exact} == exact


def test_a_second_round_reaches_inside_control_flow_and_the_bound_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = if_after_pad()
    light = _light(model, 6)
    settled = settle_shapes(light, range(len(light.graph.node)))
    assert (settled.rounds, settled.unknown) == (2, 0)
    assert settled.types["z"].shape == _run_shapes(model, 6)["z"] == (1, 8, 8)
    monkeypatch.setattr(fixed_point, "MAX_ROUNDS", 1)
    light = _light(model, 6)
    cut_short = settle_shapes(light, range(len(light.graph.node)))
    assert (cut_short.rounds, cut_short.unknown) == (1, 2)  # the If's output and the Sigmoid's


def test_a_round_that_finds_nothing_ends_the_loop() -> None:
    nodes = [
        h.make_node("Relu", ["x"], ["r"], name="relu"),
        h.make_node("Mystery", ["r"], ["m"], name="mystery", domain="com.example"),
        h.make_node("Relu", ["m"], ["y"], name="after"),
    ]
    model = _model(nodes, "y", "custom")
    model.opset_import.append(h.make_opsetid("com.example", 1))
    light = _light(model, 4)
    settled = settle_shapes(light, range(len(light.graph.node)))
    assert (settled.rounds, settled.unknown) == (2, 2)


def _report(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert cli_main(["plan", str(path), "--devices", "1", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_report_names_the_op_that_stops_propagation_and_why(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # a Reshape whose target is computed from the data: no round can size it
    nodes = [
        h.make_node("ReduceMax", ["x"], ["top"], name="top", keepdims=0),
        h.make_node("Cast", ["top"], ["rows"], name="rows", to=T.INT64),
        h.make_node("Unsqueeze", ["rows", "ax0"], ["r1"], name="r1"),
        h.make_node("Concat", ["r1", "ax0"], ["target"], name="target", axis=0),
        h.make_node("Reshape", ["x", "target"], ["y"], name="data_reshape", allowzero=1),
        h.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    report = _report(
        model_path(_model(nodes, "z", "data_target")), capsys, "--input-shape", "x=1,2,8"
    )
    model = report["model"]
    assert model["unknown_size_tensors"] == 2 and model["shape_rounds"] == 2
    [stop] = model["shape_stops"]
    assert (stop["node"], stop["op_type"]) == ("data_reshape", "Reshape")
    assert "value of input 'target'" in stop["why"] and stop["unknown_outputs"] == ["y"]
    assert any("Reshape node 'data_reshape'" in w for w in report["warnings"])


def test_a_fully_sized_model_reports_one_round_and_no_stop(
    model_path: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(model_path(swin_chain(4)), capsys, "--input-shape", "x=1,7,8")
    model = report["model"]
    assert (model["unknown_size_tensors"], model["shape_rounds"], model["shape_stops"]) == (
        0,
        1,
        [],
    )
    assert model["shape_inference"] == "onnx+constants"


_IMPORTS = """
import json, sys
from pathlib import Path
from sharderd.config import PlanConfig
from sharderd.engine import analyze_file
analyze_file(Path(sys.argv[1]), PlanConfig(input_shapes=json.loads(sys.argv[2])))
print(json.dumps([m in sys.modules for m in ("sympy", "torch")]))
"""


@pytest.mark.parametrize(
    ("name", "sympy"),
    [("gpt_decoder", False), ("window_attention", False), ("data_dependent", True)],
)
def test_sympy_loads_only_for_a_model_the_fixed_point_leaves_unknown(
    name: str, sympy: bool
) -> None:
    entry = json.loads((REPO / "tests/data/models/manifest.json").read_text())[name]
    args = [str(REPO / "tests/data/models" / entry["path"]), json.dumps(entry["ort_input_shapes"])]
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *args], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [sympy, False]  # never torch, which onnxruntime.tools imports
