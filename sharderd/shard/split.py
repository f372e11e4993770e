"""Cut an annotated model into one self-contained ONNX model per pipeline stage.

A stage receives the tensors earlier stages produce and the graph inputs it reads, and returns
what later stages or the graph need. It carries only the initializers its nodes (and their
If/Loop/Scan bodies) read. External tensors keep their references, so a 6 GB model splits
without loading a weight; locations stay relative to the model's folder.

Stage models carry no ``__ipu_number``/``__pipeline_stage`` attributes: onnxruntime ignores
unknown attributes on plain nodes, but its fusions copy a fused activation's attributes onto
the fused node (``activation___ipu_number`` on ``FusedGemm``) and then refuse the model.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from sharderd.errors import ModelInvalidError
from sharderd.graph.dataflow import build_dataflow
from sharderd.graph.propagate import inference_copy, propagate_value_infos
from sharderd.graph.tensors import all_tensors
from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR
from sharderd.shard.write import write_model

__all__ = [
    "ANNOTATIONS",
    "StageModel",
    "external_locations",
    "infer_value_infos",
    "split_stages",
    "stage_of_nodes",
    "standalone_model",
    "strip_annotations",
    "write_stages",
]

ANNOTATIONS = frozenset({IPU_ATTR, STAGE_ATTR})


@dataclass(frozen=True, slots=True)
class StageModel:
    """One pipeline stage as a standalone model."""

    index: int
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    """Tensors it receives: outputs of earlier stages and graph inputs it reads, in first-read order."""
    outputs: tuple[str, ...]
    """Tensors it returns: those later stages read and graph outputs it produces, in production order."""
    base_dir: Path
    """The folder external-data locations in ``model`` are relative to (the source model's)."""

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.model.graph.node)


def split_stages(model: onnx.ModelProto, base_dir: Path) -> list[StageModel]:
    """One ``StageModel`` per ``__pipeline_stage`` value, in stage order; ``model`` is not changed.

    A model without annotations is a single stage. Raises ``ModelInvalidError`` when only some
    nodes are annotated, a tensor flows from a later stage to an earlier one, or a stage boundary
    tensor has no type even after shape inference.
    """
    graph = model.graph
    nodes = list(graph.node)
    flow = build_dataflow(graph)
    stage = stage_of_nodes(graph)
    n_stages = int(stage.max()) + 1
    order = flow.topo_order.tolist()
    n_weights = len(graph.initializer) + len(graph.sparse_initializer)

    producer_stage = np.full(flow.num_tensors, -1, dtype=np.int64)
    last_reader = np.full(flow.num_tensors, -1, dtype=np.int64)
    for n in order:
        s = int(stage[n])
        producer_stage[flow.outputs(n)] = s
        np.maximum.at(last_reader, flow.inputs(n), s)
    for n in order:
        s = int(stage[n])
        for t in flow.inputs(n).tolist():
            if producer_stage[t] > s:
                raise ModelInvalidError(
                    f"cannot split: node {nodes[n].name!r} on stage {s} reads {flow.tensor_names[t]!r} "
                    f"from the later stage {int(producer_stage[t])}"
                )

    members: list[list[int]] = [[] for _ in range(n_stages)]
    for n in order:
        members[int(stage[n])].append(n)
    empty = [s for s, m in enumerate(members) if not m]
    if empty:
        raise ModelInvalidError(
            f"cannot split: stages {empty} have no nodes (stages must be 0..N-1 without gaps)"
        )

    types = infer_value_infos(model)
    for value in (*graph.input, *graph.output):
        types[value.name] = value  # the model's own declarations win over inference
    outputs = {o.name for o in graph.output}
    stages = []
    for s, node_ids in enumerate(members):
        ins: dict[str, None] = {}
        outs: list[str] = []
        weights: dict[int, None] = {}
        for n in node_ids:
            for t in flow.inputs(n).tolist():
                if producer_stage[t] != s:
                    ins.setdefault(flow.tensor_names[t], None)
            for w in flow.weights(n).tolist():
                if w < n_weights:  # the rest are Constants and body tensors, carried by their node
                    weights.setdefault(w, None)
            for t in flow.outputs(n).tolist():
                name = flow.tensor_names[t]
                if last_reader[t] > s or name in outputs:
                    outs.append(name)
        stage_model = standalone_model(
            model,
            [nodes[n] for n in node_ids],
            sorted(weights),
            [_typed(types, name, s, "input") for name in ins],
            [_typed(types, name, s, "output") for name in outs],
            doc=f"pipeline stage {s} of {graph.name or 'the model'}",
            name=f"{graph.name or 'graph'}_stage{s}",
        )
        stages.append(StageModel(s, stage_model, tuple(ins), tuple(outs), Path(base_dir)))
    return stages


def stage_of_nodes(graph: onnx.GraphProto) -> np.ndarray:
    """int64 stage of every top-level node: ``__pipeline_stage``, else ``__ipu_number``, else 0 for all."""
    stage = np.full(len(graph.node), -1, dtype=np.int64)
    for n, node in enumerate(graph.node):
        values = {
            a.name: a.i
            for a in node.attribute
            if a.name in (STAGE_ATTR, IPU_ATTR) and a.type == onnx.AttributeProto.INT
        }
        stage[n] = values.get(STAGE_ATTR, values.get(IPU_ATTR, -1))
    if (stage < 0).all():
        stage[:] = 0
    elif (stage < 0).any():
        missing = [
            graph.node[n].name or f"#{n} {graph.node[n].op_type}"
            for n in np.flatnonzero(stage < 0)[:5]
        ]
        raise ModelInvalidError(
            f"cannot split: nodes without an INT {STAGE_ATTR} while others have one: {missing}"
        )
    return stage


def strip_annotations(graph: onnx.GraphProto) -> int:
    """Remove the sharding attributes from every node, bodies included; returns how many."""
    removed = 0
    for node in graph.node:
        for k in reversed(range(len(node.attribute))):
            if node.attribute[k].name in ANNOTATIONS:
                del node.attribute[k]
                removed += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                removed += strip_annotations(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    removed += strip_annotations(body)
    return removed


def infer_value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Tensor name → inferred ``ValueInfoProto`` (symbolic dims stay symbolic).

    Inference runs on a copy whose large initializers carry only their type, so models with
    gigabytes of inline weights are not serialised again. A model inference cannot handle gives
    what the file itself declares.
    """
    found: dict[str, onnx.ValueInfoProto] = {}
    for value in (*model.graph.value_info, *model.graph.output, *model.graph.input):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            found[value.name] = value
    for name, value in propagate_value_infos(inference_copy(model)).items():
        if value.type.tensor_type.elem_type:
            found[name] = value
    return found


def write_stages(stages: Sequence[StageModel], out_dir: Path, *, stem: str = "model") -> list[Path]:
    """Write ``<stem>.stage<i>.onnx`` per stage, with the external data files they reference.

    Locations are never rewritten: a data file missing from ``out_dir`` is copied there (by the
    kernel, not through Python memory). Writing into the model's own folder, or a folder that
    already holds its data (the shard output), copies nothing. onnxruntime refuses data files
    that are symlinks, hard links or outside the model's folder, so a copy is the only portable
    way to put stages elsewhere.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stage in stages:
        for location in external_locations(stage.model):
            src, dst = stage.base_dir / location, out_dir / location
            if not dst.exists() or (
                dst.stat().st_size != src.stat().st_size and not dst.samefile(src)
            ):
                _copy(src, dst)
        path = out_dir / f"{stem}.stage{stage.index}.onnx"
        write_model(stage.model, path)
        paths.append(path)
    return paths


def external_locations(model: onnx.ModelProto) -> list[str]:
    """Distinct external-data locations ``model`` references, bodies included, in first-use order."""
    found: dict[str, None] = {}
    for _, tensor in all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    found.setdefault(entry.value, None)
    return list(found)


def standalone_model(
    model: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    weights: list[int],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    *,
    doc: str,
    name: str,
) -> onnx.ModelProto:
    """Some of ``model``'s nodes as a model of their own, annotations stripped. ``weights`` index
    the model's initializers, then its sparse initializers (Dataflow's order)."""
    src = model.graph
    stage = _header_copy(model)
    stage.producer_name = model.producer_name
    stage.producer_version = model.producer_version
    stage.domain = model.domain
    stage.model_version = model.model_version
    stage.metadata_props.extend(model.metadata_props)
    stage.doc_string = doc
    graph = stage.graph
    graph.name = name
    graph.node.extend(nodes)
    strip_annotations(graph)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    n_dense = len(src.initializer)
    for w in weights:
        if w >= n_dense:
            graph.sparse_initializer.append(src.sparse_initializer[w - n_dense])
            continue
        tensor = src.initializer[w]
        graph.initializer.append(tensor)
        if model.ir_version < 4:  # before IR 4 every initializer is also a graph input
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    boundary = {v.name for v in (*inputs, *outputs)}
    produced = {name for node in nodes for name in node.output if name and name not in boundary}
    graph.value_info.extend(v for v in src.value_info if v.name in produced)
    return stage


def _header_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """What any model derived from ``model`` needs besides its graph."""
    copy = onnx.ModelProto(ir_version=model.ir_version)
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    return copy


def _typed(
    types: dict[str, onnx.ValueInfoProto], name: str, stage: int, role: str
) -> onnx.ValueInfoProto:
    value = types.get(name)
    if value is None:
        raise ModelInvalidError(
            f"cannot split: stage {stage} {role} {name!r} has no type, and shape inference could not find one",
            hint="add a value_info entry for it to the model (onnx.shape_inference.infer_shapes may help)",
        )
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = name
    return copy


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
