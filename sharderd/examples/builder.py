"""The pieces every example builder shares: a graph accumulator, seeded weights, option checks.

Models use opset 17 and IR version 8 (onnxruntime 1.17+ loads them); weights are drawn at a small
scale, so outputs stay finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sharderd.errors import ConfigError

OPSET = 17
"""LayerNormalization needs 17; PopRT and onnxruntime >= 1.17 both accept it."""
IR_VERSION = 8
"""The highest IR version onnxruntime 1.17 loads."""

WEIGHT_SCALE = 0.02


class Graph:
    """Accumulates one graph's nodes and initializers.

    Every output tensor is named ``<node name>_output_0`` (graph outputs excepted) whether or not the
    node keeps its name, so ``name_nodes=False`` empties node names only and tensors stay unique.
    """

    __slots__ = ("initializers", "name_nodes", "nodes")

    def __init__(self, *, name_nodes: bool) -> None:
        self.name_nodes = name_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(
        self, op_type: str, name: str, *inputs: str, out: str | None = None, **attrs: Any
    ) -> str:
        """Add a node; returns its output, named ``out`` when that is a graph output."""
        output = f"{name}_output_0" if out is None else out
        node = helper.make_node(
            op_type, list(inputs), [output], name=name if self.name_nodes else "", **attrs
        )
        self.nodes.append(node)
        return output

    def to_graph(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
    ) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.initializers)


def empty_model(doc: str) -> onnx.ModelProto:
    return onnx.ModelProto(
        ir_version=IR_VERSION,
        opset_import=[helper.make_opsetid("", OPSET)],
        producer_name="sharderd.examples",
        doc_string=doc,
    )


def graph_model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = empty_model(doc)
    model.graph.CopyFrom(graph)
    return model


def require(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise ConfigError(f"example model option {key} {rule}")


def positive(**values: int) -> None:
    for key, value in values.items():
        require(
            isinstance(value, int) and value >= 1, key, f"must be an integer >= 1, got {value!r}"
        )


def normal(rng: np.random.Generator, *shape: int, scale: float = WEIGHT_SCALE) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def scalar(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def float_info(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
