"""Which evaluator decides computed shapes best: onnx's ReferenceEvaluator node by node (what
``sharderd.graph.evaluate`` uses) against onnxruntime on the extracted constant subgraph.

For each real export at its manifest input shapes: symbolic inference first (as ``shape_info``
does), then each evaluator computes the same constant expressions (sources: initializers of at
most ``VALUE_BYTES``, ``Shape``/``Size`` of statically shaped tensors; results over
``VALUE_BYTES`` dropped), inference runs again with the values as initializers, and the tensors
still unknown are counted. The ORT side extracts the constant nodes into one model (``Shape`` and
``Size`` replaced by ``Constant``s of the known shape), builds a session and runs it once; its time
includes extraction and the session. Times are the median of 5 runs in this process.

    python bench/constant_evaluators.py            # Markdown table for docs/shapes.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
from shape_engines import fixed_inputs, median_s

from sharderd.graph.evaluate import (
    _NOT_EVALUATED,
    VALUE_BYTES,
    _shape_without_data,
    constant_values,
    with_values,
)
from sharderd.graph.load import load_model
from sharderd.graph.propagate import TensorType, propagate_shapes
from sharderd.graph.tensors import tensor_nbytes

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"
NAMES = [
    "tiny_gpt2",
    "tiny_bert",
    "window_attention",
    "tiny_unet",
    "unet_attn64",
    "gpt_decoder",
    "bert_encoder",
    "tiny_mobilenet_v2",
]


def _unknown(graph: onnx.GraphProto, types: Mapping[str, TensorType]) -> int:
    return sum(
        1
        for n in graph.node
        for o in n.output
        if o and (types.get(o) is None or types[o].shape is None)
    )


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def ort_constant_values(
    light: onnx.ModelProto, types: Mapping[str, TensorType]
) -> dict[str, np.ndarray]:
    """The same constant expressions, extracted into one model and run by onnxruntime."""
    graph = light.graph
    inputs = {i.name for i in graph.input}
    small = [
        t
        for t in graph.initializer
        if t.name not in inputs
        and t.data_location != onnx.TensorProto.EXTERNAL
        and tensor_nbytes(t) <= VALUE_BYTES
    ]
    known = {t.name for t in small}
    nodes: list[onnx.NodeProto] = []
    outputs: list[str] = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_EVALUATED:
            continue
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            continue
        named = [n for n in node.input if n]
        if node.op_type in ("Shape", "Size"):
            tt = types.get(named[0]) if named else None
            if tt is None or tt.shape is None:
                continue
            (value,) = _shape_without_data(node, tt.shape)
            nodes.append(
                onnx.helper.make_node(
                    "Constant", [], [node.output[0]], value=onnx.numpy_helper.from_array(value)
                )
            )
        elif all(n in known for n in named):
            big = [
                o
                for o in node.output
                if (tt := types.get(o)) is not None
                and tt.shape is not None
                and int(np.prod(tt.shape)) * 8 > VALUE_BYTES
            ]
            if big:
                continue
            nodes.append(node)
        else:
            continue
        known.update(o for o in nodes[-1].output if o)
        outputs += [o for o in nodes[-1].output if o]
    if not nodes:
        return {}
    sub = onnx.helper.make_graph(
        nodes,
        "constants",
        [],
        [onnx.helper.make_empty_tensor_value_info(o) for o in outputs],
        small,
    )
    model = onnx.helper.make_model(sub, opset_imports=[onnx.helper.make_opsetid("", _opset(light))])
    model.ir_version = light.ir_version
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    values = session.run(None, {})
    return {
        n: np.asarray(v)
        for n, v in zip(names, values, strict=True)
        if isinstance(v, np.ndarray) and v.nbytes <= VALUE_BYTES
    }


def _after(light: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> int:
    again = propagate_shapes(with_values(light, values))
    types = dict(again.types)
    for name, value in values.items():
        types[name] = TensorType(onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
    return _unknown(light.graph, types)


def row(name: str, entry: Mapping[str, object]) -> str:
    """One table row: both evaluators on one export."""
    shapes = entry["ort_input_shapes"]
    assert isinstance(shapes, dict)
    light = fixed_inputs(load_model(DATA / str(entry["path"])).model, shapes)
    first = propagate_shapes(light)
    opset = _opset(light)
    ref = constant_values(light.graph, first.types, opset)
    ref_s = median_s(lambda: constant_values(light.graph, first.types, opset))
    try:
        onx = ort_constant_values(light, first.types)
        ort_s = median_s(lambda: ort_constant_values(light, first.types))
    except Exception as error:  # a failure is a measurement too
        ort_cell = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
    else:
        same = ref.keys() == onx.keys() and all(
            np.array_equal(ref[k], onx[k]) and ref[k].dtype == onx[k].dtype for k in ref
        )
        ort_cell = f"{len(onx)}, {ort_s * 1e3:.0f}, {_after(light, onx)}, {'yes' if same else 'NO'}"
    return (
        f"| {name} | {len(light.graph.node)} | {_unknown(light.graph, first.types)} | "
        f"{len(ref)}, {ref_s * 1e3:.0f}, {_after(light, ref)} | {ort_cell} |"
    )


def main(names: list[str]) -> None:
    manifest = json.loads((DATA / "manifest.json").read_text())
    print(
        "| model | nodes | unknown after inference | ReferenceEvaluator: values, ms, unknown "
        "after | onnxruntime subgraph: values, ms, unknown after, same values |"
    )
    print("|---|---|---|---|---|")
    for name in names:
        print(row(name, manifest[name]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or NAMES)
