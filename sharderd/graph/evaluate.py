"""Constant expressions evaluated once the inputs are static, so computed shapes become numbers.

Exporters compute Reshape targets, masks and pads at run time (``Shape → Gather → Mod → Sub →
Concat → Pad``); with the input shapes fixed those are plain numbers. ``ConstantValues`` computes
the value of a tensor when it is a constant expression, on demand: what node-level inference
(graph/fixed_point.py) needs to size a node, and no more. The ops of shape arithmetic run in numpy
(graph/shape_ops.py); every other node with onnx's reference evaluator
(``onnx.reference.ReferenceEvaluator``), one node at a time; docs/shapes.md says why.

Never a big weight is read: only initializers of at most ``VALUE_BYTES`` (not external) and
``Shape``/``Size`` of static tensors are sources, and a node is evaluated only when its inputs are
known and its outputs stay that small (a ``Transpose`` or ``Cast`` of a weight is left alone: it is a
weight of its result's size, costed by graph/folding.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx.numpy_helper

from sharderd.graph import shape_ops
from sharderd.graph.propagate import TensorType, model_shell
from sharderd.graph.tensors import tensor_nbytes

__all__ = ["VALUE_BYTES", "ConstantValues", "constant_values", "with_values"]

VALUE_BYTES = 4096
"""Largest constant evaluated or kept: shape-sized (the same bound propagate.py keeps values under)."""

_NOT_EVALUATED = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
    | {"Bernoulli", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty"}
)
_SIZED_BY_VALUES = frozenset({"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Pad"})
"""Ops whose output size comes from input values: evaluated only when inference sized it small."""


class ConstantValues:
    """The values of a graph's constant expressions, each computed once, when first asked for.

    ``types`` is read live: a ``Shape`` of a tensor whose size inference has found since is
    computable from then on. A tensor that cannot be a constant (a graph input, a big or external
    weight, the output of a random or control-flow op, or of a node reading one) is remembered as
    such; one that only waits for a shape is asked again later (``forget_pending``).
    """

    def __init__(self, graph: onnx.GraphProto, types: Mapping[str, TensorType], opset: int):
        self.types = types
        self.opset = opset
        self.producer = {o: node for node in graph.node for o in node.output if o}
        inputs = {i.name for i in graph.input}
        self.known: dict[str, np.ndarray] = {}
        self.computed: dict[str, np.ndarray] = {}
        """The values evaluated from nodes (the initializers' aside)."""
        self.never: set[str] = set(inputs)
        self.pending: set[str] = set()
        for t in graph.initializer:
            if (
                t.name in inputs
                or t.data_location == onnx.TensorProto.EXTERNAL
                or tensor_nbytes(t) > VALUE_BYTES
            ):
                self.never.add(t.name)
                continue
            try:
                self.known[t.name] = onnx.numpy_helper.to_array(t)
            except (ValueError, TypeError):  # malformed data: analysis reports it, not this
                self.never.add(t.name)

    def forget_pending(self) -> None:
        """Ask again for values that waited for a shape (a new round of inference found more)."""
        self.pending.clear()

    def value(self, name: str) -> np.ndarray | None:
        """``name``'s value when it is a constant expression of small values, else None."""
        stack = [name]
        visiting: set[str] = set()
        while stack:
            top = stack[-1]
            if top in self.known or top in self.never or top in self.pending:
                stack.pop()
                continue
            node = self.producer.get(top)
            if node is None:
                self.never.add(top)
                stack.pop()
                continue
            outs = [o for o in node.output if o]
            named = [i for i in node.input if i]
            if node.op_type in ("Shape", "Size") and _evaluable(node):
                self._evaluate(node, outs, named)  # reads its input's size, not its value
            elif not _evaluable(node) or any(i in self.never for i in named):
                self.never.update(outs)
            elif any(i in self.pending for i in named):
                self.pending.update(outs)
            elif missing := [i for i in named if i not in self.known]:
                if top in visiting:  # a cycle: build_dataflow refuses those, this stays safe
                    self.never.update(outs)
                else:
                    visiting.add(top)
                    stack.extend(missing)
                    continue
            else:
                self._evaluate(node, outs, named)
            stack.pop()
        return self.known.get(name)

    def _evaluate(self, node: onnx.NodeProto, outs: list[str], named: list[str]) -> None:
        if node.op_type in ("Shape", "Size"):
            tt = self.types.get(named[0]) if named else None
            if tt is None or tt.shape is None:
                self.pending.update(outs)
                return
            results: list[np.ndarray] | None = _shape_without_data(node, tt.shape)
        elif node.op_type in _SIZED_BY_VALUES and not all(_small(self.types.get(o)) for o in outs):
            self.pending.update(outs)
            return
        else:
            positional = [self.known[i] if i else None for i in node.input]
            results = shape_ops.run(node, positional)
            if results is None:
                results = _run(node, {i: self.known[i] for i in named}, self.opset)
        if results is None:
            self.never.update(outs)
            return
        for out, value in zip(node.output, results, strict=False):
            if not out:
                continue
            if isinstance(value, np.ndarray) and value.nbytes <= VALUE_BYTES:
                self.known[out] = self.computed[out] = value
            else:
                self.never.add(out)


def _evaluable(node: onnx.NodeProto) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_EVALUATED:
        return False
    return not any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    )


def _run(
    node: onnx.NodeProto, feeds: Mapping[str, np.ndarray], opset: int
) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    graph = onnx.helper.make_graph(
        [node],
        "constant",
        [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape
            )
            for n, v in feeds.items()
        ],
        [
            onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
            for o in node.output
            if o
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        return list(ReferenceEvaluator(model).run(None, dict(feeds)))
    except Exception:  # an op the reference cannot run is left for inference to size
        return None


def constant_values(
    graph: onnx.GraphProto, types: Mapping[str, TensorType], opset: int
) -> dict[str, np.ndarray]:
    """Values of every node output computable from small constants (``graph``'s default-domain
    ``opset``): ``ConstantValues`` asked for all of them."""
    values = ConstantValues(graph, types, opset)
    for node in graph.node:
        for out in node.output:
            if out:
                values.value(out)
    return values.computed


def _shape_without_data(node: onnx.NodeProto, shape: tuple[int, ...]) -> list[np.ndarray]:
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape)), dtype=np.int64)]
    attrs = {a.name: a.i for a in node.attribute}
    end = attrs["end"] if "end" in attrs else len(shape)  # Shape-15 slicing, negatives included
    return [np.array(shape[attrs.get("start", 0) : end], dtype=np.int64)]


def _small(tt: TensorType | None) -> bool:
    if tt is None or tt.shape is None:
        return False
    return int(np.prod(tt.shape)) * 8 <= VALUE_BYTES


def with_values(light: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``light`` with the nodes whose outputs all have ``values`` replaced by those initializers."""
    copy = model_shell(light)
    source, graph = light.graph, copy.graph
    graph.initializer.extend(source.initializer)
    outputs = {o.name for o in source.output}
    for node in source.node:
        outs = [o for o in node.output if o]
        if outs and all(o in values and o not in outputs for o in outs):
            graph.initializer.extend(onnx.numpy_helper.from_array(values[o], o) for o in outs)
        else:
            graph.node.append(node)
    return copy
