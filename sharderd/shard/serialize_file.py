"""The nodes too big for one device, and a shard's copy of the model with them cut into pieces.

``too_big_pieces`` reads the model without its weights (no analysis: the splittable nodes' weights
are their initializer inputs) and asks ``plan.serialize_choice`` which nodes no split can hold
whole. ``sharderd plan`` prices those rewrites (``serialize_bottleneck.decide``); a shard keeps
every one, so ``serialize_file`` writes them before the model is analysed: it rewrites each with
``shard.serialize`` under a work directory, next to links to the original external data (never
copies). With nothing to serialize it returns the original path and no records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from sharderd.config import PlanConfig
from sharderd.filenames import safe_name
from sharderd.graph.load import load_model
from sharderd.plan.serialize_choice import choose_pieces
from sharderd.shard.serialize import (
    Serialized,
    max_pieces,
    serialize_node,
    splittable,
    weight_input,
)
from sharderd.shard.write import copy_external_data, write_model
from sharderd.target import Target

__all__ = ["serialize_file", "too_big_pieces"]


def serialize_file(
    path: Path, config: PlanConfig, target: Target, work_dir: Path
) -> tuple[Path, tuple[Serialized, ...]]:
    """The path to plan (the serialized copy, or ``path`` itself) and what was serialized."""
    loaded = load_model(path)
    chosen = too_big_pieces(loaded.model, config, target)
    if not chosen:
        return path, ()
    work_dir.mkdir(parents=True, exist_ok=True)
    copy_external_data(loaded.external_files, path.parent, work_dir, link=True)
    model, done = loaded.model, []
    for n, (name, pieces) in enumerate(chosen.items()):
        data = work_dir / f"{safe_name(path.stem)}.serialized{n}.data"
        model, record = serialize_node(model, name, pieces, base_dir=path.parent, data_path=data)
        done.append(record)
    out = work_dir / f"{safe_name(path.stem)}.serialized.onnx"
    write_model(model, out)
    return out, tuple(done)


def too_big_pieces(model: onnx.ModelProto, config: PlanConfig, target: Target) -> dict[str, int]:
    """Node name → pieces, in graph order, for the splittable nodes whose weights alone exceed one
    device (``serialize_choice.choose_pieces``); reads the initializers' dims only."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = list(model.graph.node)
    per_node = np.zeros(len(nodes))
    limits = np.zeros(len(nodes), dtype=np.int64)
    for i, node in enumerate(nodes):
        kind = splittable(model, node, inits)
        if kind is not None:
            names = [n for n in node.input if n in inits]
            per_node[i] = sum(_planned_bytes(inits[n], config) for n in names)
            limits[i] = max_pieces(node, kind, inits[weight_input(node, kind)])
    chosen = choose_pieces(per_node, limits, float(target.memory_bytes))
    return {nodes[i].name: pieces for i, pieces in sorted(chosen.items())}


def _planned_bytes(tensor: onnx.TensorProto, config: PlanConfig) -> float:
    """The tensor's bytes at the planned precision (an fp32 weight is halved at ``fp16``)."""
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    half = config.precision == "fp16" and dtype == np.float32
    return float(np.prod(tensor.dims, dtype=np.float64)) * (2 if half else dtype.itemsize)
