"""Weights that lie in a file we read, held in the proto as external data at their place in it.

``graph.load`` leaves a model's large inline tensors in the user's ``.onnx`` file (``graph.skim``)
and the fp16 conversion reads every weight from where it lies (``shard.convert``); either way the
tensor becomes external data whose ``location`` is the **absolute** path of that file, with its
``offset`` and ``length``. Everything that reads external data (``base_dir / location``) reads it
unchanged, and an absolute location says "not a data file beside the model": the loader refuses
absolute locations in files, so only these references carry one. They live in memory only: the
writers (``shard.write``) put the bytes back inline, or point a compile attempt at a link to the
file; no written model holds one.

A compile attempt's model says which of its locations are such links (``LINKS``, a
``metadata_props`` entry onnxruntime and PopRT ignore; ``graph.weights.read_model_proto`` adds the
file's own name when it holds inline weights), so that what a backend writes from it
(onnxruntime's stage files) holds those weights inline, as the user's model did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from sharderd.graph.tensors import all_tensors, tensor_nbytes

__all__ = [
    "LINKS",
    "InFile",
    "claim_links",
    "drop_links",
    "every_tensor",
    "in_file",
    "in_file_tensors",
    "linked",
    "point_at",
    "point_external_at",
    "record_links",
]

_EXPLICIT = "sharderd.data_location"
"""Marks a tensor whose ``data_location`` field was written (as DEFAULT) where it came from, so a
faithful copy writes it again; in memory only, like the reference itself."""


LINKS = "sharderd.inline_weights"
"""``metadata_props`` key of a compile attempt's model: JSON, each location that links to a model
file whose inline weights the attempt reads → the offsets of those whose ``data_location`` was
written (``InFile.explicit_default``)."""


@dataclass(frozen=True, slots=True)
class InFile:
    source: str
    """Absolute path of the file the bytes are in."""
    offset: int
    length: int
    """Bytes there (at the tensor's own type, or fp32 when the tensor became fp16 since)."""
    explicit_default: bool


def point_at(
    tensor: onnx.TensorProto, source: str, offset: int, length: int, explicit_default: bool
) -> None:
    """Make ``tensor`` (its data already dropped) refer to ``length`` bytes at ``offset`` in ``source``."""
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", source), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))
    if explicit_default:
        tensor.external_data.add(key=_EXPLICIT, value="0")


def point_external_at(tensor: onnx.TensorProto, base_dir: Path) -> None:
    """A data-file reference relative to ``base_dir`` made absolute (``load_external_data`` would
    have written ``data_location`` as DEFAULT when it read the bytes in)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    source = str((base_dir / info["location"]).absolute())
    length = int(info["length"]) if "length" in info else tensor_nbytes(tensor)
    point_at(tensor, source, int(info.get("offset", "0")), length, True)


def in_file(tensor: onnx.TensorProto) -> InFile | None:
    """Where ``tensor``'s bytes lie when it is such a reference, else None."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {entry.key: entry.value for entry in tensor.external_data}
    source = info.get("location", "")
    if not Path(source).is_absolute() or "offset" not in info or "length" not in info:
        return None
    return InFile(source, int(info["offset"]), int(info["length"]), _EXPLICIT in info)


def in_file_tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, InFile]]:
    """Every tensor of ``model`` (bodies and functions included) that is such a reference."""
    for tensor in every_tensor(model):
        where = in_file(tensor)
        if where is not None:
            yield tensor, where


def every_tensor(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """``all_tensors`` of the graph, then the tensors the functions' nodes hold: every tensor
    ``onnx.external_data_helper`` reads in, and sparse values."""
    for _, tensor in all_tensors(model.graph):
        yield tensor
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors
                for graph in (attr.g,) if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    yield from (tensor for _, tensor in all_tensors(graph))


def linked(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The links ``model`` names (``LINKS``): location → offsets whose data_location was written."""
    links: dict[str, list[int]] = {}
    for entry in model.metadata_props:
        if entry.key == LINKS:
            links.update(json.loads(entry.value))
    return links


def record_links(model: onnx.ModelProto, links: dict[str, list[int]]) -> None:
    """Add ``links`` to those ``model`` names (see ``LINKS``)."""
    merged = {**linked(model), **links}
    drop_links(model)
    entry = model.metadata_props.add()
    entry.key, entry.value = LINKS, json.dumps(merged, sort_keys=True)


def drop_links(model: onnx.ModelProto) -> None:
    kept = [e for e in model.metadata_props if e.key != LINKS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)


def claim_links(model: onnx.ModelProto, base_dir: Path, links: dict[str, list[int]]) -> None:
    """Make ``model``'s references through ``links`` (locations relative to ``base_dir``, from
    ``linked``) in-file references: what is written from it holds those weights inline."""
    for tensor in every_tensor(model):
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location")
        if tensor.data_location == onnx.TensorProto.EXTERNAL and location in links:
            offset = int(info.get("offset", "0"))
            source = str((base_dir / location).absolute())
            length = int(info["length"]) if "length" in info else tensor_nbytes(tensor)
            point_at(tensor, source, offset, length, offset in links[location])
