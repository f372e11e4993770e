"""Whole-model shape inference on a weight-free copy: ONNX's own (C++, with data propagation), and
onnxruntime's symbolic inference (graph/symbolic.py) for what needs symbols.

``inference_copy`` turns weights into typed graph inputs, so no weight byte is read and nothing is
written anywhere. graph/fixed_point.py drives ONNX's inference to a fixed point with the values of
the constant expressions; ``propagate_shapes`` (symbolic first, ONNX's inference as the fallback)
runs only for what that leaves unknown, and ``propagate_value_infos`` keeps symbolic dims for
splitting a model into stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from sharderd.graph.shape_types import (
    DataDependentShape,
    TensorType,
    collect_types,
    collect_value_infos,
)
from sharderd.graph.symbolic import first_line, resolve_symbols, symbolic_inference
from sharderd.graph.tensors import tensor_nbytes

__all__ = [
    "DataDependentShape",
    "Propagation",
    "TensorType",
    "collect_types",
    "inference_copy",
    "model_shell",
    "onnx_inference",
    "propagate_shapes",
    "propagate_value_infos",
]

_KEEP_VALUE_BYTES = 4096
"""Initializers up to this size keep their values (Reshape targets, pads, axes); larger ones are weights."""


@dataclass(frozen=True, slots=True)
class Propagation:
    types: Mapping[str, TensorType]
    engine: str
    """``onnxruntime-symbolic`` or ``onnx`` (the fallback)."""
    error: str | None
    """Why the first engine was not used, if it was not."""
    data_dependent: tuple[DataDependentShape, ...]
    notes: tuple[str, ...]
    """What the inference engine warned about (uncertain comparisons, unsupported broadcasts)."""


def model_shell(model: onnx.ModelProto, *, inputs: bool = True) -> onnx.ModelProto:
    """A new model with ``model``'s IR version, producer, opsets and functions, and its graph's
    name, outputs, sparse initializers and (``inputs``) inputs: no node, no initializer."""
    shell = onnx.ModelProto()
    shell.ir_version = model.ir_version
    shell.producer_name, shell.producer_version = model.producer_name, model.producer_version
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    shell.graph.name = model.graph.name
    if inputs:
        shell.graph.input.extend(model.graph.input)
    shell.graph.output.extend(model.graph.output)
    shell.graph.sparse_initializer.extend(model.graph.sparse_initializer)
    return shell


def inference_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with weights turned into typed graph inputs: inference sees shapes, never bytes.

    Small inline initializers keep their values, since shape subgraphs read them. External ones
    never do: reading them would read weights from disk.
    """
    light = model_shell(model, inputs=False)
    light.ir_version = max(model.ir_version, 4)  # initializers need not be inputs from IR 4 on
    source, graph = model.graph, light.graph
    graph.node.extend(source.node)
    stubbed: set[str] = set()
    for tensor in source.initializer:
        if (
            tensor.data_location != onnx.TensorProto.EXTERNAL
            and tensor_nbytes(tensor) <= _KEEP_VALUE_BYTES
        ):
            graph.initializer.append(tensor)
            continue
        stubbed.add(tensor.name)
        graph.input.append(
            onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
        )
    kept = {t.name for t in graph.initializer}
    graph.input.extend(v for v in source.input if v.name not in kept and v.name not in stubbed)
    return light


def propagate_shapes(light: onnx.ModelProto) -> Propagation:
    """Infer every tensor's type on ``light`` (an ``inference_copy`` with static inputs)."""
    notes: list[str] = []
    inferred, engine, error = _infer(light, notes)
    raw: dict[str, onnx.ValueInfoProto] = {}
    collect_value_infos(inferred.graph, raw)
    types, data_dependent = resolve_symbols(inferred.graph, raw)
    return Propagation(types, engine, error, tuple(data_dependent), tuple(dict.fromkeys(notes)))


def propagate_value_infos(light: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Tensor name → inferred ``ValueInfoProto``, symbolic dims kept (for splitting into stages)."""
    inferred, _, _ = _infer(light, [])
    raw: dict[str, onnx.ValueInfoProto] = {}
    collect_value_infos(inferred.graph, raw)
    return raw


def _infer(light: onnx.ModelProto, notes: list[str]) -> tuple[onnx.ModelProto, str, str | None]:
    try:
        return symbolic_inference(light, notes), "onnxruntime-symbolic", None
    except Exception as exc:  # the library raises bare Exception and assertion errors
        error = f"onnxruntime symbolic shape inference: {first_line(exc)}"
        return onnx_inference(light), "onnx", error


def onnx_inference(light: onnx.ModelProto) -> onnx.ModelProto:
    """``light`` with ONNX's inferred value infos (data propagation on where it is safe); ``light``
    itself when the library fails."""
    try:
        return onnx.shape_inference.infer_shapes(
            light, check_type=False, strict_mode=False, data_prop=_data_prop_is_safe(light)
        )
    except Exception:
        return light


_DATA_PROP_MAX_ELEMENTS = 1 << 16
"""onnx's data propagation keeps ~150 bytes per element of 1-D tensors: shape vectors are tiny,
a 2**24-element input would take gigabytes. Bigger 1-D tensors switch it off."""


def _data_prop_is_safe(model: onnx.ModelProto) -> bool:
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if (
            len(dims) == 1
            and dims[0].HasField("dim_value")
            and dims[0].dim_value > _DATA_PROP_MAX_ELEMENTS
        ):
            return False
    tensors = [*model.graph.initializer]
    tensors += [
        a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR
    ]
    return not any(len(t.dims) == 1 and t.dims[0] > _DATA_PROP_MAX_ELEMENTS for t in tensors)
