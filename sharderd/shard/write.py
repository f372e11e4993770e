"""Write an annotated model next to a copy of its external data, without loading the weights."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx

from sharderd.fsutil import atomic_write
from sharderd.graph.load import ExternalFile

__all__ = ["copy_external_data", "write_converted", "write_model"]

_INLINE_LIMIT = 2**31 - 2**26
"""Below protobuf's 2 GiB with room for the graph itself."""


def copy_external_data(
    files: tuple[ExternalFile, ...], src_dir: Path, out_dir: Path, *, link: bool = False
) -> list[Path]:
    """Put each external file at the same relative location under ``out_dir``.

    ``link=True`` (compile attempts, which only read) hard-links, or symlinks across filesystems,
    so a 6 GB model is not copied per attempt. Results are copied: ``shutil.copyfile`` uses the
    kernel's copy (sendfile/copy_file_range); nothing passes through Python memory.
    """
    written = []
    for ext in files:
        src = src_dir / ext.location
        dst = out_dir / ext.location
        if src.resolve() == dst.resolve():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp")
        tmp.unlink(missing_ok=True)
        if link:
            try:
                os.link(src, tmp)
            except OSError:
                tmp.symlink_to(src.resolve())
        else:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        tmp.replace(dst)
        written.append(dst)
    return written


def write_model(model: onnx.ModelProto, path: Path) -> None:
    """Serialise the proto as it is: external tensors keep their (relative) references."""
    atomic_write(path, model.SerializeToString())


def write_converted(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write a model whose weights are in memory (after a conversion): inline when it fits in one
    protobuf, else with every weight in ``<stem>.data`` beside it. Returns the data files written."""
    total = sum(len(t.raw_data) for t in model.graph.initializer)
    if total < _INLINE_LIMIT:
        write_model(model, path)
        return []
    data = path.with_name(path.name.removesuffix(".onnx") + ".data")
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save_model(
        model,
        str(tmp),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    tmp.replace(path)
    return [data]
