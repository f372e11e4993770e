"""Write an annotated model next to its external data, without holding the weights in memory.

A model's weights are in data files beside it (copied, or linked for a compile attempt) or inline
in the user's file (``graph.in_file``): those are streamed into the written model
(``shard.stream``), or, for a compile attempt, referred to through a link to that file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx

from sharderd.fsutil import atomic_write
from sharderd.graph.in_file import in_file, in_file_tensors, record_links
from sharderd.graph.load import ExternalFile
from sharderd.shard.stream import Copy, copy_to, inline_pieces, out_bytes, write_pieces

__all__ = ["copy_external_data", "link_in_file", "write_converted", "write_model"]

_INLINE_LIMIT = 2**31 - 2**26
"""Below protobuf's 2 GiB with room for the graph itself."""
_DATA_THRESHOLD = 1024
"""``write_converted``'s external data holds tensors of at least this size (``sys.getsizeof``
of their bytes, as ``onnx.save_model`` measures them)."""
_BYTES_HEADER = 33
"""``sys.getsizeof(b"")`` on 64-bit CPython: what that measure adds to a tensor's length."""


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
        if _same(src, dst):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        _place(src, dst, link=link)
        written.append(dst)
    return written


def link_in_file(model: onnx.ModelProto, out_dir: Path, taken: set[str]) -> list[Path]:
    """Point ``model``'s in-file tensors at links in ``out_dir`` to the files they lie in (a compile
    attempt reads the user's weights where they are), say so in it (``in_file.LINKS``); returns
    the links made.

    Each link is named as its file, unless that name is in ``taken`` (the attempt's own files).
    """
    links: dict[str, str] = {}
    explicit: dict[str, list[int]] = {}
    made = []
    for tensor, where in list(in_file_tensors(model)):
        name = links.get(where.source)
        if name is None:
            name = Path(where.source).name
            while name in taken or name in links.values():
                name = f"inline-{name}"
            links[where.source] = name
            explicit[name] = []
            dst = out_dir / name
            if not _same(Path(where.source), dst):
                _place(Path(where.source), dst, link=True)
                made.append(dst)
        if where.explicit_default:
            explicit[name].append(where.offset)
        del tensor.external_data[:]
        for key, value in (("location", name), ("offset", where.offset), ("length", where.length)):
            tensor.external_data.add(key=key, value=str(value))
    if explicit:
        record_links(model, explicit)
    return made


def _same(src: Path, dst: Path) -> bool:
    return src.resolve() == dst.resolve()


def _place(src: Path, dst: Path, *, link: bool) -> None:
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


def write_model(model: onnx.ModelProto, path: Path) -> None:
    """Serialise the proto: external tensors keep their (relative) references, in-file ones are
    written inline, streamed from where they lie."""
    if next(in_file_tensors(model), None) is None:
        atomic_write(path, model.SerializeToString())
    else:
        write_pieces(inline_pieces(model), path)


def write_converted(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write a converted model, its weights in memory or in-file (``shard.convert``): inline when
    they fit in one protobuf, else every weight of ``_DATA_THRESHOLD`` bytes or more in
    ``<stem>.data`` beside it, as ``onnx.save_model(save_as_external_data=True)`` lays it out.
    Returns the data files written."""
    total = sum(_weight_bytes(t) for t in model.graph.initializer)
    if total < _INLINE_LIMIT:
        write_model(model, path)
        return []
    data = path.with_name(path.name.removesuffix(".onnx") + ".data")
    if next(in_file_tensors(model), None) is not None:
        _write_with_data_file(model, path, data)
        return [data]
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save_model(
        model,
        str(tmp),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=_DATA_THRESHOLD,
    )
    tmp.replace(path)
    return [data]


def _weight_bytes(tensor: onnx.TensorProto) -> int:
    where = in_file(tensor)
    return len(tensor.raw_data) if where is None else out_bytes(tensor, where).size


def _write_with_data_file(model: onnx.ModelProto, path: Path, data: Path) -> None:
    """``onnx.save_model``'s external layout (its tensor order, sizes and entries), the bytes
    streamed from where they lie."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    pieces: list[bytes | Copy] = []
    offset = 0
    for tensor in _initializers(work.graph):
        where = in_file(tensor)
        if where is not None:
            piece: bytes | Copy = out_bytes(tensor, where)
        elif tensor.HasField("raw_data"):
            piece = tensor.raw_data
        else:
            continue
        size = len(piece) if isinstance(piece, bytes) else piece.size
        if size + _BYTES_HEADER < _DATA_THRESHOLD:
            continue
        pieces.append(piece)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", data.name), ("offset", offset), ("length", size)):
            tensor.external_data.add(key=key, value=str(value))
        offset += size
    fd = os.open(data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        copy_to(fd, pieces)
        os.fsync(fd)
    finally:
        os.close(fd)
    write_model(work, path)


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers in ``onnx.external_data_helper``'s order: the graph's, then its bodies'."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _initializers(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _initializers(sub)
