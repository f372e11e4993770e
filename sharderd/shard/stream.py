"""Write a model whose weights lie in files we read (``graph.in_file``), each weight's bytes copied
from where it lies into the output once: by the kernel (``copy_file_range``) or through a bounded
buffer, converted to fp16 on the way when its type became FLOAT16 since it was read.

The output is byte for byte what protobuf writes for the same model holding those bytes inline
(``SerializeToString``). Each reference is replaced by a unique placeholder of a few bytes, the
model is serialized (small, without its weights), and the placeholders' enclosing fields are
walked: every length prefix on the way down is re-encoded for the real size, and the placeholder
becomes the copy. Protobuf writes fields in number order and lengths as minimal varints, so the
sizes are the only thing that differs.
"""

from __future__ import annotations

import bisect
import errno
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from sharderd.errors import SharderdError
from sharderd.fsutil import fsync_dir
from sharderd.graph.in_file import InFile, in_file_tensors
from sharderd.graph.tensors import tensor_nbytes
from sharderd.graph.wire import decode_varint, encode_varint

__all__ = ["Copy", "copy_to", "inline_pieces", "out_bytes", "write_pieces"]

_CHUNK = 1 << 22
"""Bytes per read when the kernel cannot copy, or when converting (4 MiB, a multiple of 4)."""
_MARK = 16
"""Random bytes shared by every placeholder of one write, then an 8-byte index."""


@dataclass(frozen=True, slots=True)
class Copy:
    """``length`` bytes at ``offset`` in ``source``, written as ``size`` bytes."""

    source: str
    offset: int
    length: int
    to_fp16: bool

    @property
    def size(self) -> int:
        return self.length // 2 if self.to_fp16 else self.length


Piece = bytes | Copy


def out_bytes(tensor: onnx.TensorProto, where: InFile) -> Copy:
    """What writing ``tensor`` copies: its bytes, converted when it became FLOAT16 from fp32."""
    need = tensor_nbytes(tensor)
    if where.length == need:
        return Copy(where.source, where.offset, where.length, False)
    if tensor.data_type == onnx.TensorProto.FLOAT16 and where.length == 2 * need:
        return Copy(where.source, where.offset, where.length, True)
    raise SharderdError(  # the loader checked every length against the dims: a bug here
        f"internal error: tensor {tensor.name!r} refers to {where.length} bytes for {need}"
    )


def inline_pieces(model: onnx.ModelProto) -> list[Piece]:
    """``model`` serialized with every in-file tensor's bytes inline, as pieces to write."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    mark = secrets.token_bytes(_MARK)
    copies: dict[bytes, Copy] = {}
    for k, (tensor, where) in enumerate(list(in_file_tensors(work))):
        copy = out_bytes(tensor, where)
        placeholder = mark + k.to_bytes(8, "little")
        copies[placeholder] = copy
        del tensor.external_data[:]
        if where.explicit_default:
            tensor.data_location = onnx.TensorProto.DEFAULT
        else:
            tensor.ClearField("data_location")
        tensor.raw_data = placeholder
    data = work.SerializeToString()
    if not copies:
        return [data]
    marks = list(_find_all(data, mark))
    pieces, _ = _splice(data, 0, len(data), marks, copies)
    return pieces


def _find_all(data: bytes, mark: bytes) -> Iterator[int]:
    at = data.find(mark)
    while at >= 0:
        yield at
        at = data.find(mark, at + 1)


def _splice(
    data: bytes, lo: int, hi: int, marks: Sequence[int], copies: dict[bytes, Copy]
) -> tuple[list[Piece], int]:
    """The message in ``data[lo:hi]`` as pieces (placeholders made copies, lengths re-encoded)
    and its size once written."""
    pieces: list[Piece] = []
    size = 0
    run = pos = lo
    while pos < hi:
        key, at = decode_varint(data, pos)
        assert key is not None
        wire = key & 7
        if wire == 0:
            pos = decode_varint(data, at)[1]
        elif wire in (1, 5):
            pos = at + (8 if wire == 1 else 4)
        elif wire == 2:
            length, start = decode_varint(data, at)
            assert length is not None
            end = start + length
            i = bisect.bisect_left(marks, start)
            if i < len(marks) and marks[i] < end:  # a placeholder is in this field
                copy = copies.get(data[start:end])
                sub: list[Piece]
                if copy is not None:
                    sub, sub_size = [copy], copy.size
                else:
                    sub, sub_size = _splice(data, start, end, marks, copies)
                head = data[pos:at] + encode_varint(sub_size)
                pieces += [data[run:pos], head, *sub]
                size += pos - run + len(head) + sub_size
                run = end
            pos = end
        else:  # protobuf never writes groups for ONNX's messages
            raise SharderdError(f"internal error: wire type {wire} in a serialized model")
    pieces.append(data[run:hi])
    size += hi - run
    return pieces, size


def write_pieces(pieces: Sequence[Piece], path: Path, *, durable: bool = True) -> None:
    """Write ``pieces`` to ``path`` as ``fsutil.atomic_write`` writes bytes (a temp file, fsync,
    rename): a reader never sees a partial model."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            copy_to(fd, pieces)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def copy_to(fd: int, pieces: Sequence[Piece]) -> int:
    """Append ``pieces`` at ``fd``'s position; returns the bytes written."""
    sources: dict[str, int] = {}
    written = 0
    pending: list[bytes] = []
    try:
        for piece in pieces:
            if isinstance(piece, bytes):
                pending.append(piece)
                continue
            written += _write_all(fd, b"".join(pending))
            pending.clear()
            src = sources.get(piece.source)
            if src is None:
                src = sources[piece.source] = os.open(piece.source, os.O_RDONLY | os.O_CLOEXEC)
            written += _convert(src, fd, piece) if piece.to_fp16 else _copy(src, fd, piece)
        written += _write_all(fd, b"".join(pending))
    finally:
        for src in sources.values():
            os.close(src)
    return written


def _write_all(fd: int, data: bytes | memoryview) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _copy(src: int, fd: int, piece: Copy) -> int:
    """The bytes as they are: the kernel copies them when it can, else 4 MiB at a time."""
    offset, left = piece.offset, piece.length
    while left:
        try:
            done = os.copy_file_range(src, fd, left, offset_src=offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = _write_all(fd, _read(src, offset, min(left, _CHUNK), piece))
        if done == 0:
            _short(piece)
        offset += done
        left -= done
    return piece.length


def _convert(src: int, fd: int, piece: Copy) -> int:
    """fp32 bytes written as fp16 with onnxruntime's own conversion, 4 MiB of input at a time."""
    from onnxruntime.transformers.float16 import convert_np_to_float16

    for offset in range(piece.offset, piece.offset + piece.length, _CHUNK):
        size = min(_CHUNK, piece.offset + piece.length - offset)
        values = np.frombuffer(_read(src, offset, size, piece), dtype="float32")
        _write_all(fd, convert_np_to_float16(values).tobytes())
    return piece.size


def _read(src: int, offset: int, size: int, piece: Copy) -> bytes:
    data = os.pread(src, size, offset)
    if len(data) < size:
        _short(piece)
    return data


def _short(piece: Copy) -> None:
    raise SharderdError(
        f"{piece.source} changed while it was read: it ends before byte {piece.offset + piece.length}",
        hint="leave the model file alone while sharderd reads it, then run again",
    )
