"""onnxruntime sessions for models whose weights live in external data files.

onnxruntime memory-maps external data itself, lazily, when it may open the files: a model is
built from bytes with its source folder as the external-data folder. It refuses data files that
are symlinks or have several hard links (how attempt folders may share a model's data). A
symlinked folder is followed to the real one; hard-linked files are mapped here and handed over
with ``add_external_initializers``, which costs a copy inside onnxruntime, and tensors in
If/Loop bodies are then read into the proto (small by nature).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx

from sharderd.backends.ort_options import OPTIMIZATION_LEVELS
from sharderd.errors import ModelInvalidError
from sharderd.graph.load import parse_model_bytes
from sharderd.graph.tensors import all_tensors, tensor_nbytes
from sharderd.shard.split import external_locations

__all__ = ["OrtSession", "read_model_proto", "session_options"]

_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
"""Where a model built from bytes finds its external data."""
_QUIET = 3
"""onnxruntime log severity: errors only (they reach us as exceptions anyway)."""


def session_options(ort: Any, *, optimization: str, threads: int | None = None) -> Any:
    """Quiet ``SessionOptions`` at a level of ``OPTIMIZATION_LEVELS``; ``threads`` per session."""
    so = ort.SessionOptions()
    so.log_severity_level = _QUIET
    so.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[optimization]
    )
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return so


class OrtSession:
    """An ``InferenceSession`` and any weight buffers it reads, which must outlive it."""

    __slots__ = ("buffers", "session")

    def __init__(self, session: Any, buffers: list[Any]) -> None:
        self.session = session
        self.buffers = buffers

    @classmethod
    def build(
        cls,
        ort: Any,
        model: onnx.ModelProto,
        base_dir: Path,
        so: Any,
        providers: list[str],
        provider_options: list[dict[str, str]] | None = None,
    ) -> OrtSession:
        """Raises onnxruntime's own exceptions; the caller knows what they mean for the attempt."""
        buffers: list[Any] = []
        locations = external_locations(model)
        folder = _data_folder(base_dir, locations) if locations and _folder_option(ort) else None
        if folder is not None:
            so.add_session_config_entry(_EXTERNAL_FOLDER, str(folder))
        elif locations:
            model, buffers = _hand_over_weights(ort, model, base_dir, so)
        session = ort.InferenceSession(
            model.SerializeToString(), so, providers=providers, provider_options=provider_options
        )
        return cls(session, buffers)

    def run(self, outputs: list[str], feed: Mapping[str, Any]) -> list[Any]:
        return self.session.run(outputs, feed)


def read_model_proto(path: Path) -> onnx.ModelProto:
    """The model proto without its weights.

    Not ``load_model``: the parent validated the job already, and attempt folders may reach the
    data through a symlink that points outside them. Locations are still held to relative paths
    without ``..``.
    """
    try:
        model = parse_model_bytes(path.read_bytes(), str(path))
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
    for owner, tensor in all_tensors(model.graph):
        if _is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            pure = PurePosixPath(location.replace("\\", "/"))
            if not location or pure.is_absolute() or ".." in pure.parts:
                raise ModelInvalidError(
                    f"tensor {tensor.name or owner!r}: external data location {location!r} must be "
                    "a relative path inside the model's folder"
                )
    return model


def _folder_option(ort: Any) -> bool:
    """Whether this onnxruntime reads ``_EXTERNAL_FOLDER`` (added in 1.18)."""
    try:
        major, minor = (int(x) for x in ort.__version__.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (1, 18)


def _data_folder(base_dir: Path, locations: Sequence[str]) -> Path | None:
    """A folder holding every location as a plain file onnxruntime accepts, or None.

    ``base_dir`` itself, else the one real folder its symlinks lead to.
    """
    candidates: set[Path] = set()
    for location in locations:
        path = base_dir / location
        if _plain_file(path):
            candidates.add(base_dir)
            continue
        real = Path(os.path.realpath(path))
        parts = PurePosixPath(location.replace("\\", "/")).parts
        if not _plain_file(real) or real.parts[-len(parts) :] != parts:
            return None
        candidates.add(Path(*real.parts[: -len(parts)]))
    return candidates.pop() if len(candidates) == 1 else None


def _plain_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _hand_over_weights(
    ort: Any, model: onnx.ModelProto, base_dir: Path, so: Any
) -> tuple[onnx.ModelProto, list[Any]]:
    """Map top-level external initializers for ``add_external_initializers``; inline the rest."""
    names, values, buffers = [], [], []
    unmapped = set()
    for tensor in model.graph.initializer:
        if not _is_external(tensor):
            continue
        array = _map_tensor(tensor, base_dir)
        if array is None:
            unmapped.add(tensor.name)
            continue
        names.append(tensor.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        buffers.append(array)
    if unmapped or any(_is_external(t) for t in _nested_tensors(model.graph)):
        model = _with_inlined(model, base_dir, unmapped)
    if names:
        so.add_external_initializers(names, values)
    return model, [*buffers, *values]


def _map_tensor(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray | None:
    """A read-only memory map of an external tensor; None for dtypes numpy cannot map."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.kind not in "biufc":
        return None
    shape = tuple(tensor.dims)
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(
        base_dir / info["location"],
        dtype=dtype,
        mode="r",
        offset=int(info.get("offset", "0")),
        shape=shape,
    )


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _nested_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Tensors held by nodes: Constant/attribute values and everything inside bodies."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from (t for _, t in all_tensors(attr.g))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    yield from (t for _, t in all_tensors(body))


def _with_inlined(model: onnx.ModelProto, base_dir: Path, names: set[str]) -> onnx.ModelProto:
    """A copy whose nested external tensors, and the initializers in ``names``, hold their bytes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    top = [t for t in copy.graph.initializer if t.name in names and _is_external(t)]
    for tensor in [*top, *(t for t in _nested_tensors(copy.graph) if _is_external(t))]:
        tensor.raw_data = _read_external(tensor, base_dir)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return copy


def _read_external(tensor: onnx.TensorProto, base_dir: Path) -> bytes:
    """The bytes of an external tensor (onnx's own reader refuses hard-linked files too)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    length = int(info["length"]) if "length" in info else tensor_nbytes(tensor)
    with open(base_dir / info["location"], "rb") as f:
        f.seek(int(info.get("offset", "0")))
        return f.read(length)
