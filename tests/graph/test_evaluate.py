"""Constant expressions evaluated once the inputs are static (graph/evaluate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from sharderd.config import PlanConfig
from sharderd.graph.analyze import analyze
from sharderd.graph.evaluate import VALUE_BYTES, constant_values
from sharderd.graph.load import LoadedModel
from sharderd.graph.propagate import TensorType


def _loaded(model: onnx.ModelProto) -> LoadedModel:
    return LoadedModel(Path("m.onnx"), model, "0" * 64, model.ByteSize(), (), 0)


def swin_pad_model() -> onnx.ModelProto:
    """Swin-style window padding: H and W padded up to a multiple of 4 with pads computed from
    ``Shape`` as ``(4 - H % 4) % 4``, which symbolic shape inference does not decide."""
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape")]
    for axis, dim in ((1, "h"), (2, "w")):
        nodes += [
            h.make_node("Gather", ["s", f"i{axis}"], [f"{dim}d"], name=f"g{dim}", axis=0),
            h.make_node("Mod", [f"{dim}d", "four"], [f"{dim}m"], name=f"m{dim}"),
            h.make_node("Sub", ["four", f"{dim}m"], [f"{dim}s"], name=f"s{dim}"),
            h.make_node("Mod", [f"{dim}s", "four"], [f"{dim}p"], name=f"p{dim}"),
            h.make_node("Unsqueeze", [f"{dim}p", "ax0"], [f"{dim}u"], name=f"u{dim}"),
        ]
    nodes += [
        h.make_node("Concat", ["z5", "hu", "wu", "z1"], ["pads"], name="cat", axis=0),
        h.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
        h.make_node("Relu", ["xp"], ["y"], name="relu"),
    ]
    inits = [nh.from_array(np.array(v, np.int64), n) for n, v in (("i1", 1), ("i2", 2))]
    inits += [nh.from_array(np.array(4, np.int64), "four")]
    inits += [nh.from_array(np.zeros(k, np.int64), n) for n, k in (("z5", 5), ("z1", 1))]
    inits += [nh.from_array(np.array([0], np.int64), "ax0")]
    graph = h.make_graph(
        nodes,
        "swin_pad",
        [h.make_tensor_value_info("x", T.FLOAT, [1, "H", "W", 8])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_computed_pads_become_numbers() -> None:
    analysis = analyze(
        _loaded(swin_pad_model()), PlanConfig(input_shapes={"x": (1, 7, 6, 8)}, name_nodes=True)
    )
    assert analysis.costs.unknown_tensors == ()
    assert analysis.shapes.types["y"].shape == (1, 8, 8, 8)
    assert analysis.shapes.types["pads"].shape == (8,)
    # the pad subgraph is still folded (free), the Pad and Relu compiled
    assert analysis.compiled_ops == 2


def test_a_constant_expression_over_a_big_weight_is_not_evaluated() -> None:
    big = nh.from_array(np.ones((64, 64), np.float32), "w")  # 16 KiB, over VALUE_BYTES
    small = nh.from_array(np.ones((4, 4), np.float32), "v")
    assert big.ByteSize() > VALUE_BYTES
    graph = h.make_graph(
        [
            h.make_node("Transpose", ["w"], ["wt"], name="t"),
            h.make_node("Cast", ["v"], ["vc"], name="c", to=T.FLOAT16),
        ],
        "g",
        [],
        [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("wt", "vc")],
        [big, small],
    )
    types = {"wt": TensorType(T.FLOAT, (64, 64)), "vc": TensorType(T.FLOAT16, (4, 4))}
    values = constant_values(graph, types, 17)
    assert set(values) == {"vc"} and values["vc"].dtype == np.float16
