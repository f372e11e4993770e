"""Reading a model and its external weights where onnx's own reader refuses the files.

Compile attempts reach a job's data through hard links or symlinks so that a 6 GB model is not
copied per attempt; onnx (1.20+) refuses both as a possible link attack, onnxruntime refuses
them too. Locations are still held to relative paths without ``..``.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import onnx

from sharderd.errors import ModelInvalidError
from sharderd.graph.in_file import drop_links, record_links
from sharderd.graph.load import parse_model_bytes
from sharderd.graph.skim import skim_file
from sharderd.graph.tensors import all_tensors, node_tensors, tensor_nbytes

__all__ = ["is_external", "read_external", "read_model_proto", "with_inlined"]


def read_model_proto(path: Path) -> onnx.ModelProto:
    """The model proto without its weights: large inline ones refer to their bytes in ``path``
    itself (``location`` its file name, named in ``in_file.LINKS``), as external data onnxruntime
    reads where it lies.

    Not ``load_model``: the parent validated the job already, and attempt folders may reach the
    data through a symlink that points outside them. Locations are still held to relative paths
    without ``..``.
    """
    try:
        with open(path, "rb") as f:
            skimmed = skim_file(f, os.fstat(f.fileno()).st_size, str(path))
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
    model = parse_model_bytes(skimmed.data, str(path))
    for span in skimmed.spans:
        tensor = model.graph.initializer[span.index]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (
            ("location", path.name),
            ("offset", span.offset),
            ("length", span.length),
        ):
            tensor.external_data.add(key=key, value=str(value))
    if skimmed.spans:
        record_links(model, {path.name: [s.offset for s in skimmed.spans if s.explicit_default]})
    for owner, tensor in all_tensors(model.graph):
        if is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            pure = PurePosixPath(location.replace("\\", "/"))
            if not location or pure.is_absolute() or ".." in pure.parts:
                raise ModelInvalidError(
                    f"tensor {tensor.name or owner!r}: external data location {location!r} must be "
                    "a relative path inside the model's folder"
                )
    return model


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def with_inlined(
    model: onnx.ModelProto, base_dir: Path, names: set[str] | None = None
) -> onnx.ModelProto:
    """A copy whose nested external tensors, and the initializers in ``names`` (all when None),
    hold their bytes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if names is None:
        drop_links(copy)  # every reference is gone
    top = [
        t for t in copy.graph.initializer if (names is None or t.name in names) and is_external(t)
    ]
    for tensor in [*top, *(t for _, t in node_tensors(copy.graph) if is_external(t))]:
        tensor.raw_data = read_external(tensor, base_dir)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return copy


def read_external(tensor: onnx.TensorProto, base_dir: Path) -> bytes:
    """The bytes of an external tensor (onnx's own reader refuses hard-linked files too)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    length = int(info["length"]) if "length" in info else tensor_nbytes(tensor)
    with open(base_dir / info["location"], "rb") as f:
        f.seek(int(info.get("offset", "0")))
        return f.read(length)
