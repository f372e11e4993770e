"""graph/shape_ops.py computes what onnx's reference evaluator computes, value and dtype, on every
constant node of the real exports and on the edges of each op's definition (negative indices and
axes, integer division toward zero, both Mod signs, reversed slices, Reshape's 0 and -1)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

from sharderd.graph import shape_ops
from sharderd.graph.evaluate import _run, constant_values
from tests.real_exports import MANIFEST, export_analysis

OPSET = 17


def _same(node: onnx.NodeProto, *inputs: np.ndarray) -> None:
    fast = shape_ops.run(node, list(inputs))
    assert fast is not None, f"{node.op_type} is not covered"
    names = [i for i in node.input if i]
    reference = _run(node, dict(zip(names, inputs, strict=True)), OPSET)
    assert reference is not None
    for mine, theirs in zip(fast, reference, strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        np.testing.assert_array_equal(mine, theirs)


def _node(op: str, n_in: int, **attrs: object) -> onnx.NodeProto:
    return h.make_node(op, [f"i{k}" for k in range(n_in)], ["y"], **attrs)


I64 = np.int64


@pytest.mark.parametrize(
    ("node", "inputs"),
    [
        (_node("Div", 2), (np.array([-7, 7, -6, 5], I64), np.array([2, -2, 4, 5], I64))),
        (_node("Mod", 2), (np.array([-7, 7, -6], I64), np.array([3, -3, 4], I64))),
        (_node("Mod", 2, fmod=1), (np.array([-7, 7, -6], I64), np.array([3, -3, 4], I64))),
        (_node("Gather", 2, axis=0), (np.array([5, 6, 7], I64), np.array([-1, 0], I64))),
        (_node("Gather", 2, axis=1), (np.arange(6, dtype=I64).reshape(2, 3), np.array(-3, I64))),
        (_node("Unsqueeze", 2), (np.array([4, 5], I64), np.array([-1, 0], I64))),
        (_node("Squeeze", 2), (np.zeros((1, 3, 1), I64), np.array([-1], I64))),
        (_node("Squeeze", 1), (np.zeros((1, 3, 1), I64),)),
        (
            _node("Concat", 3, axis=-1),
            (np.array([1], I64), np.array([2, 3], I64), np.array([4], I64)),
        ),
        (
            _node("Slice", 5),
            (
                np.arange(10, dtype=I64),
                np.array([-2], I64),
                np.array([-(2**63)], I64),
                np.array([0], I64),
                np.array([-3], I64),
            ),
        ),
        (
            _node("Slice", 4),
            (
                np.arange(12, dtype=I64).reshape(3, 4),
                np.array([1], I64),
                np.array([2**62], I64),
                np.array([-1], I64),
            ),
        ),
        (_node("Reshape", 2), (np.arange(12, dtype=I64).reshape(3, 4), np.array([0, -1, 2], I64))),
        (_node("Cast", 1, to=onnx.TensorProto.FLOAT), (np.array([3, -(2**40)], I64),)),
        (_node("Cast", 1, to=onnx.TensorProto.INT32), (np.array([3, 7], I64),)),
        (_node("Max", 3), (np.array([1, 9], I64), np.array([4, 2], I64), np.array([3, 3], I64))),
        (_node("Min", 1), (np.array([1, 9], I64),)),
        (_node("Equal", 2), (np.array([1, 2], I64), np.array([1, 3], I64))),
        (_node("Where", 3), (np.array([True, False]), np.array([1, 2], I64), np.array([7], I64))),
        (_node("Range", 3), (np.array(10, I64), np.array(-3, I64), np.array(-4, I64))),
        (_node("Expand", 2), (np.array([[1], [2]], I64), np.array([1, 2, 3], I64))),
        (_node("Transpose", 1, perm=[1, 0]), (np.arange(6, dtype=I64).reshape(2, 3),)),
        (_node("ConstantOfShape", 1), (np.array([2, 3], I64),)),
        (
            _node("ConstantOfShape", 1, value=h.make_tensor("v", onnx.TensorProto.INT64, [1], [7])),
            (np.array([2], I64),),
        ),
    ],
    ids=lambda v: v.op_type if isinstance(v, onnx.NodeProto) else "",
)
def test_each_op_agrees_with_the_reference_at_its_edges(
    node: onnx.NodeProto, inputs: tuple[np.ndarray, ...]
) -> None:
    _same(node, *inputs)


def test_what_it_does_not_cover_is_left_to_the_reference() -> None:
    assert shape_ops.run(_node("Div", 2), [np.array([1.0]), np.array([3.0])]) is None  # floats
    assert shape_ops.run(_node("Cast", 1, to=onnx.TensorProto.INT64), [np.array([2.5])]) is None
    assert shape_ops.run(_node("Add", 2), [np.array([1], np.int32), np.array([1], I64)]) is None
    assert shape_ops.run(_node("Gather", 2), [np.array([1, 2], I64), np.array([2], I64)]) is None
    assert shape_ops.run(_node("Div", 2), [np.array([1], I64), np.array([0], I64)]) is None
    assert shape_ops.run(_node("ScatterND", 3), [np.zeros(2)] * 3) is None


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_every_constant_node_of_the_real_exports_agrees(name: str) -> None:
    analysis = export_analysis(name)
    graph = analysis.model.graph
    known = {
        t.name: onnx.numpy_helper.to_array(t)
        for t in graph.initializer
        if t.ByteSize() < 4096 and t.data_location != onnx.TensorProto.EXTERNAL  # small, in memory
    }
    known |= constant_values(graph, analysis.shapes.types, OPSET)
    checked = 0
    for node in graph.node:
        if node.op_type in ("Shape", "Size") or not all(i in known for i in node.input if i):
            continue
        if shape_ops.run(node, [known[i] if i else None for i in node.input]) is None:
            continue
        _same(node, *(known[i] for i in node.input if i))
        checked += 1
    assert checked > 0 or analysis.folded_nodes < 10
