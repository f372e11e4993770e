"""The written model as it will be compiled: planned static input shapes and the planned precision.

PopRT compiles static shapes only, so the sharded model carries the shapes the plan was made for
(``keep_dynamic`` leaves the file's own dims). For ``fp16`` the annotated model goes through
onnxruntime's float16 converter (``keep_io_types``: inputs and outputs keep their type, as PopRT's
``--precision fp16`` does); the Casts it adds are placed on the stage of their neighbours.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import onnx

from sharderd.errors import ConfigError
from sharderd.graph.in_file import every_tensor, in_file, point_external_at
from sharderd.graph.input_dims import graph_inputs
from sharderd.graph.propagate import TensorType, inference_copy, propagate_value_infos
from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR, read_annotation

__all__ = ["fix_static_shapes", "to_fp16"]


def fix_static_shapes(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, tuple[int, ...]],
    types: Mapping[str, TensorType],
) -> None:
    """Write the planned shapes into ``model``'s inputs and outputs; drop stale symbolic value_info."""
    for value in graph_inputs(model.graph):
        shape = input_shapes.get(value.name)
        if shape is not None and value.type.HasField("tensor_type"):
            _set(value, shape)
    for value in model.graph.output:
        tt = types.get(value.name)
        if tt is not None and tt.shape is not None and value.type.HasField("tensor_type"):
            _set(value, tt.shape)
    kept = [v for v in model.graph.value_info if _is_static(v)]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def to_fp16(model: onnx.ModelProto, base_dir: Path) -> tuple[onnx.ModelProto, int]:
    """An fp16 copy of the annotated ``model``; returns it and how many Cast nodes were added.

    No weight is read here: every external tensor (``base_dir`` holds the data files) becomes a
    reference to where its bytes lie (``graph.in_file``), the converter changes the types of the
    float ones, and the writer (``shard.write.write_converted``) streams each into the result,
    converted on the way, inline or into one data file as their total size decides.
    """
    work = onnx.ModelProto()
    work.CopyFrom(model)
    # The converter decides its Casts from value_info; its own ONNX inference mis-sizes exporter
    # shape subgraphs, so it gets the propagated types instead.
    inferred = propagate_value_infos(inference_copy(work))
    declared = {v.name for v in (*work.graph.input, *work.graph.output)}
    del work.graph.value_info[:]
    work.graph.value_info.extend(v for name, v in inferred.items() if name not in declared)
    for tensor in every_tensor(work):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and in_file(tensor) is None:
            point_external_at(tensor, base_dir)
    try:
        with _shapes_from_dims() as float16:
            converted = float16.convert_float_to_float16(
                work, keep_io_types=True, disable_shape_infer=True
            )
    except Exception as exc:  # the converter raises whatever its helpers raise
        raise ConfigError(
            f"the fp16 conversion failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            hint="plan without --precision fp16 (the model's own precision)",
            reruns=({"precision": "model"},),
        ) from None
    added = _place_new_nodes(converted)
    return converted, added


@contextmanager
def _shapes_from_dims() -> Iterator[ModuleType]:
    """onnxruntime's converter, reading a converted weight's shape from its dims.

    Its ``make_value_info_from_tensor`` reads the whole tensor (``numpy_helper.to_array``) only to
    take its shape; the weights here are references, so for the conversion that one function is
    replaced by one that reads the dims: the same shape for every tensor the loader accepts
    (``graph.validate``). The engine runs on one thread per process, so no other conversion sees
    the swap.
    """
    from onnxruntime.transformers import float16

    original = float16.make_value_info_from_tensor
    float16.make_value_info_from_tensor = _value_info_from_dims
    try:
        yield float16
    finally:
        float16.make_value_info_from_tensor = original


def _value_info_from_dims(tensor: onnx.TensorProto) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))


def _place_new_nodes(model: onnx.ModelProto) -> int:
    """Give every node the converter added the stage of its producers (or, for input Casts, its readers)."""
    stages = {name: ipu for name, (ipu, _) in read_annotation(model).items() if ipu is not None}
    nodes = list(model.graph.node)
    producer_stage: dict[str, int] = {}
    for node in nodes:
        if node.name in stages:
            for out in node.output:
                producer_stage[out] = stages[node.name]
    readers: dict[str, list[int]] = {}
    for node in nodes:
        if node.name in stages:
            for name in node.input:
                readers.setdefault(name, []).append(stages[node.name])
    fresh = [node for node in nodes if node.name not in stages]
    for _ in range(len(fresh)):  # a Cast may read another Cast: settle producers first
        waiting = []
        for node in fresh:
            before = [producer_stage[i] for i in node.input if i in producer_stage]
            after = [s for o in node.output for s in readers.get(o, [])]
            if not before and not after and node is not fresh[-1]:
                waiting.append(node)
                continue
            stage = max(before) if before else (min(after) if after else 0)
            for key in (IPU_ATTR, STAGE_ATTR):
                node.attribute.append(onnx.helper.make_attribute(key, stage))
            for out in node.output:
                producer_stage[out] = stage
            for name in node.input:
                readers.setdefault(name, []).append(stage)
        if not waiting or len(waiting) == len(fresh):
            fresh = waiting
            break
        fresh = waiting
    for node in fresh:
        for key in (IPU_ATTR, STAGE_ATTR):
            node.attribute.append(onnx.helper.make_attribute(key, 0))
    return len(nodes) - len(stages)


def _set(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    proto = value.type.tensor_type.shape
    proto.ClearField("dim")
    for size in shape:
        proto.dim.add().dim_value = size


def _is_static(value: onnx.ValueInfoProto) -> bool:
    tensor_type = value.type.tensor_type
    return tensor_type.HasField("shape") and all(
        d.HasField("dim_value") for d in tensor_type.shape.dim
    )
