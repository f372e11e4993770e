"""Costs at the precision the model will run at: ``fp16`` halves float weights and tensors.

PopRT's ``--precision fp16`` converts float32 weights and activations to half while graph inputs
and outputs keep their type (a Cast at each end); sharderd plans the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import onnx

from sharderd.graph.costs import GraphCosts
from sharderd.graph.dataflow import Dataflow
from sharderd.graph.propagate import TensorType

__all__ = ["at_precision", "model_precision"]

_FLOAT = onnx.TensorProto.FLOAT
_HALF = onnx.TensorProto.FLOAT16


def model_precision(flow: Dataflow) -> str:
    """``fp16`` when most weight bytes are half already, else ``fp32``."""
    half = int(flow.weight_bytes[flow.weight_types == _HALF].sum())
    single = int(flow.weight_bytes[flow.weight_types == _FLOAT].sum())
    return "fp16" if half > single else "fp32"


def at_precision(
    flow: Dataflow, costs: GraphCosts, types: Mapping[str, TensorType] | None, precision: str
) -> tuple[Dataflow, GraphCosts]:
    """Flow and costs with float32 weights and inner tensors at half size when ``precision`` is fp16."""
    if precision != "fp16":
        return flow, costs
    weight_bytes = np.where(flow.weight_types == _FLOAT, flow.weight_bytes // 2, flow.weight_bytes)
    weight_types = np.where(flow.weight_types == _FLOAT, _HALF, flow.weight_types).astype(np.int32)
    is_float = np.fromiter(
        (
            (tt := (types or {}).get(name)) is not None and tt.elem_type == _FLOAT
            for name in flow.tensor_names
        ),
        dtype=bool,
        count=flow.num_tensors,
    )
    io = (flow.producer < 0) | flow.is_graph_output
    halve = is_float & ~io
    tensor_bytes = np.where(halve, costs.tensor_bytes // 2, costs.tensor_bytes)
    return (
        replace(flow, weight_bytes=weight_bytes, weight_types=weight_types),
        replace(costs, tensor_bytes=tensor_bytes),
    )
