"""serialize_node: the rewritten graph computes what the original did, in onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.shard import serialize as ser
from sharderd.shard.serialize import SerializeError, serialize_node

RNG = np.random.default_rng(0)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def _embedding(
    vocab: int = 10, hidden: int = 3, index_type: int = TensorProto.INT64
) -> onnx.ModelProto:
    table = numpy_helper.from_array(
        RNG.standard_normal((vocab, hidden)).astype(np.float32), "table"
    )
    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="/embed/Gather", axis=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("ids", index_type, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", hidden])], [table],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("pieces", [2, 3, 10])
@pytest.mark.parametrize("index_type", [TensorProto.INT64, TensorProto.INT32])
def test_rows_equal_the_original_at_every_index(
    tmp_path: Path, pieces: int, index_type: int
) -> None:
    model = _embedding(index_type=index_type)
    ids = np.arange(
        -10, 10, dtype=helper.tensor_dtype_to_np_dtype(index_type)
    )  # every boundary, negatives
    new, done = serialize_node(model, "/embed/Gather", pieces, base_dir=tmp_path)
    onnx.checker.check_model(new)
    np.testing.assert_array_equal(_run(new, {"ids": ids}), _run(model, {"ids": ids}))
    assert done.kind == "rows" and done.pieces == pieces
    assert done.piece_nodes == tuple(f"/embed/Gather/piece{i}/Gather" for i in range(pieces))
    assert "table" not in {t.name for t in new.graph.initializer}


def test_rows_stream_from_and_to_external_data(tmp_path: Path) -> None:
    model = _embedding(vocab=64, hidden=8)
    values = numpy_helper.to_array(model.graph.initializer[0])
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)  # fmt: skip
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    data = tmp_path / "pieces.data"
    new, _ = serialize_node(
        loaded, "/embed/Gather", 4, base_dir=tmp_path, data_path=data, inline_limit=0
    )
    assert all(
        t.data_location == TensorProto.EXTERNAL for t in new.graph.initializer if len(t.dims) == 2
    )
    onnx.save(new, tmp_path / "s.onnx")
    ids = np.array([0, 15, 16, 17, 63, -1, -64], np.int64)
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"ids": ids})[0], values[ids])


def _projection(op: str, trans_b: bool = False, bias_width: int | None = None) -> onnx.ModelProto:
    k, n = 6, 7
    w = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    attrs = {"transB": 1, "alpha": 0.5} if op == "Gemm" and trans_b else {}
    if bias_width is not None:
        inits.append(
            numpy_helper.from_array(RNG.standard_normal(bias_width).astype(np.float32), "b")
        )
        inputs.append("b")
    node = helper.make_node(op, inputs, ["y"], name="/head/" + op, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("op", "trans_b", "bias"),
    [
        ("MatMul", False, None),
        ("Gemm", False, 7),
        ("Gemm", True, 7),
        ("Gemm", True, 1),
        ("Gemm", False, None),
    ],
)
def test_columns_equal_the_original(
    tmp_path: Path, op: str, trans_b: bool, bias: int | None
) -> None:
    model = _projection(op, trans_b, bias)
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    new, done = serialize_node(model, f"/head/{op}", 3, base_dir=tmp_path)
    onnx.checker.check_model(new)
    np.testing.assert_allclose(_run(new, {"x": x}), _run(model, {"x": x}), rtol=1e-6, atol=1e-6)
    assert done.kind == "columns" and len(done.piece_nodes) == 3


def test_bounds_cover_without_gaps() -> None:
    assert ser._bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]


def test_refuses_what_it_cannot_split(tmp_path: Path) -> None:
    model = _embedding()
    model.graph.node[0].attribute[0].i = 1
    with pytest.raises(SerializeError):
        serialize_node(model, "/embed/Gather", 2, base_dir=tmp_path)
    with pytest.raises(SerializeError):
        serialize_node(_embedding(vocab=4), "/embed/Gather", 5, base_dir=tmp_path)
