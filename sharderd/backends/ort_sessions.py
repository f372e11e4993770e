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
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx

from sharderd.backends.ort_options import OPTIMIZATION_LEVELS
from sharderd.graph.tensors import node_tensors
from sharderd.graph.weights import is_external, with_inlined
from sharderd.shard.split import external_locations

__all__ = ["OrtSession", "session_options"]

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
        if not is_external(tensor):
            continue
        array = _map_tensor(tensor, base_dir)
        if array is None:
            unmapped.add(tensor.name)
            continue
        names.append(tensor.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        buffers.append(array)
    if unmapped or any(is_external(t) for _, t in node_tensors(model.graph)):
        model = with_inlined(model, base_dir, unmapped)
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
