"""Every tensor's size once the inputs are static: inference and constant evaluation to a fixed point.

A window-attention model (Swin) pads each block's input up to a multiple of the window, with pads
computed from the shape of the previous block's output (``Shape → Gather → Mod → Sub → Concat →
Pad``). ONNX's whole-model inference sizes everything up to the first such ``Pad`` and stops: the
pads are values it does not compute. Inferring the whole model again after evaluating what it
found resolves one more block per pass, so 12 blocks take 12 passes.

One round here is: ONNX's whole-model inference (C++, with data propagation), then one sweep over
the nodes in topological order that, for each node whose outputs are still unknown, asks
``ConstantValues`` for the values of its inputs and runs ONNX's inference of that node alone with
them (``onnx.shape_inference.infer_node_outputs``); what a node finds is there for the next. A
sweep therefore carries every block's pads to the end of the model in one pass. A further round
runs only while tensors stay unknown and the last round found some: it re-infers the whole model
with the values as initializers and the sizes found as value infos, which reaches what a sweep
does not enter (``If``/``Loop``/``Scan`` bodies, model-local functions). ``MAX_ROUNDS`` bounds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.numpy_helper
from onnx.helper import make_tensor_type_proto, np_dtype_to_tensor_dtype

from sharderd.graph.dataflow import body_outer_references
from sharderd.graph.evaluate import ConstantValues, with_values
from sharderd.graph.propagate import onnx_inference
from sharderd.graph.shape_types import TensorType, add_constants, collect_value_infos, static_type

__all__ = ["MAX_ROUNDS", "Settled", "node_output_types", "settle_shapes", "unknown_outputs"]

MAX_ROUNDS = 4
"""Rounds of (whole-model inference, sweep) at most. The first sweep sizes every top-level node
it can; a later round can only add what whole-model inference derives inside control-flow bodies
and functions from the values found, and a round that finds nothing ends the loop. Bodies whose
own values decide the sizes of other bodies are the rare case more rounds reach; past four the
remaining tensors are reported unknown, with the node that stops them."""

_CONTROL_FLOW = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


@dataclass(frozen=True, slots=True)
class Settled:
    types: dict[str, TensorType]
    raw: dict[str, onnx.ValueInfoProto]
    """The last whole-model inference's value infos (partial shapes kept)."""
    values: dict[str, np.ndarray]
    """The constant expressions evaluated (each at most ``evaluate.VALUE_BYTES``)."""
    rounds: int
    unknown: int
    """Node outputs whose size is still unknown."""


def unknown_outputs(nodes: Sequence[onnx.NodeProto], types: Mapping[str, TensorType]) -> int:
    return sum(1 for node in nodes for o in node.output if o and _shape(types.get(o)) is None)


def settle_shapes(light: onnx.ModelProto, order: Sequence[int]) -> Settled:
    """Sizes of ``light``'s tensors (an ``inference_copy`` with static inputs); ``order`` is a
    topological order of its nodes."""
    graph = light.graph
    opset = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    types: dict[str, TensorType] = {}
    raw: dict[str, onnx.ValueInfoProto] = {}
    values = ConstantValues(graph, types, opset)
    sweep = _Sweep(light, types, raw, values)
    nodes = [graph.node[i] for i in order]
    rounds, unknown = 0, unknown_outputs(nodes, types)
    while rounds < MAX_ROUNDS:
        rounds += 1
        before = unknown
        model = light if rounds == 1 else _with_found(light, values.computed, types)
        found: dict[str, onnx.ValueInfoProto] = {}
        collect_value_infos(onnx_inference(model).graph, found)
        for name, value in found.items():
            raw[name] = value
            if _shape(types.get(name)) is None:
                types[name] = static_type(value)
        add_constants(graph, types)
        values.forget_pending()
        sweep.run(nodes)
        unknown = unknown_outputs(nodes, types)
        if unknown == 0 or unknown >= before:
            break
    return Settled(types, raw, dict(values.computed), rounds, unknown)


class _Sweep:
    """Node-level inference in topological order, fed the values of constant inputs."""

    def __init__(
        self,
        light: onnx.ModelProto,
        types: dict[str, TensorType],
        raw: Mapping[str, onnx.ValueInfoProto],
        values: ConstantValues,
    ) -> None:
        self.types, self.raw, self.values = types, raw, values
        self.opsets = list(light.opset_import)
        self.versions = {o.domain or "": o.version for o in light.opset_import}
        self.schemas: dict[tuple[str, str], onnx.defs.OpSchema | None] = {}

    def run(self, nodes: Sequence[onnx.NodeProto]) -> None:
        for node in nodes:
            outs = [o for o in node.output if o]
            if all(_shape(self.types.get(o)) is not None for o in outs):
                continue
            if node.domain not in ("", "ai.onnx"):
                continue  # reported as a stop
            if any(a.type in _CONTROL_FLOW for a in node.attribute):
                for name in (*node.input, *body_outer_references(node)):
                    if name:
                        self.values.value(name)  # for the next round's whole-model inference
                continue
            self._infer(node, outs)
            for out in outs:
                if _shape(self.types.get(out)) is None:
                    value = self.values.value(out)
                    if value is not None:
                        dtype = np_dtype_to_tensor_dtype(value.dtype)
                        self.types[out] = TensorType(dtype, tuple(value.shape))

    def _infer(self, node: onnx.NodeProto, outs: list[str]) -> None:
        schema = self._schema(node)
        if schema is None:
            return
        given: dict[str, onnx.TypeProto] = {}
        data: dict[str, onnx.TensorProto] = {}
        for name in node.input:
            if not name or name in given:
                continue
            type_proto = self._type_proto(name)
            if type_proto is None:
                return
            given[name] = type_proto
            value = self.values.value(name)
            if value is not None:
                data[name] = onnx.numpy_helper.from_array(value, name)
        for out, found in node_output_types(schema, node, given, data, self.opsets).items():
            if found.shape is not None or out not in self.types:
                self.types[out] = found

    def _schema(self, node: onnx.NodeProto) -> onnx.defs.OpSchema | None:
        key = (node.op_type, node.domain)
        if key not in self.schemas:
            version = self.versions.get(node.domain, self.versions.get("ai.onnx", 0))
            try:
                self.schemas[key] = onnx.defs.get_schema(node.op_type, version, node.domain)
            except onnx.defs.SchemaError:
                self.schemas[key] = None
        return self.schemas[key]

    def _type_proto(self, name: str) -> onnx.TypeProto | None:
        known = self.types.get(name)
        if known is not None and known.shape is not None:
            return make_tensor_type_proto(known.elem_type, known.shape)
        value = self.raw.get(name)
        if value is not None:
            return value.type
        if known is not None and known.elem_type:
            return make_tensor_type_proto(known.elem_type, None)
        return None


def node_output_types(
    schema: onnx.defs.OpSchema,
    node: onnx.NodeProto,
    given: Mapping[str, onnx.TypeProto],
    data: Mapping[str, onnx.TensorProto],
    opsets: Sequence[onnx.OperatorSetIdProto],
) -> dict[str, TensorType]:
    """ONNX's inference of ``node`` alone: its outputs' types from its inputs' (``given``, every
    input it names) and the values of those known (``data``); {} when the op rejects them."""
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, node, dict(given), dict(data), opset_imports=list(opsets)
        )
    except Exception:  # the op's inference rejects these inputs: its outputs stay unknown
        return {}
    return {
        out: static_type(onnx.ValueInfoProto(name=out, type=t))
        for out, t in inferred.items()
        if t.HasField("tensor_type")
    }


def _with_found(
    light: onnx.ModelProto, values: Mapping[str, np.ndarray], types: Mapping[str, TensorType]
) -> onnx.ModelProto:
    """``light`` with the evaluated values as initializers and every size found as a value info."""
    model = with_values(light, values)
    made = {o for node in model.graph.node for o in node.output if o}
    made -= {v.name for v in model.graph.output}
    for name in sorted(made):
        tt = types.get(name)
        if tt is not None and tt.shape is not None and tt.elem_type:
            model.graph.value_info.append(
                onnx.helper.make_tensor_value_info(name, tt.elem_type, list(tt.shape))
            )
    return model


def _shape(tt: TensorType | None) -> tuple[int, ...] | None:
    return None if tt is None else tt.shape
