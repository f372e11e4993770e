"""Read a model file's structure in one forward pass, its large inline weights left where they lie.

A model exported with its weights inline (every torch export under 2 GB) is one protobuf message;
parsing it whole holds every weight in memory, twice (the file's bytes and the parsed copy). This
walks protobuf's wire format instead, through a bounded buffer: every field of the model is copied
as it is, except the ``raw_data`` of graph initializers over ``IN_FILE_MIN_BYTES``, which is
skipped and recorded as a ``Span`` (its offset and length in the file). The copy parses with
protobuf as the whole file would, less those bytes; ``graph.load`` then points each such tensor at
its span as external data, so every later step handles it as it handles external data. The file's
SHA-256 is computed in the same pass.

Why not protobuf or onnx: neither can parse a message while leaving one bytes field unread
(``onnx.load(load_external_data=False)`` only concerns data that is already external), and a memory
map would count every page it touches in the process's memory.

Anything the walk does not expect (a group, a duplicated ``raw_data``, a tensor already marked
external, a file cut outside the graph) is copied as it is, so protobuf's verdict on it (through
``graph.load.parse_model_bytes``) is the one it gives the whole file. Damage in the graph is named
here: the file ending inside it (a cut copy), a field running past its record, and, naming the
tensor, data running past the end of the file or of its own record (into another field).
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BufferedReader

from sharderd.errors import ModelInvalidError
from sharderd.graph.reader import CorruptVarint, HashingReader
from sharderd.graph.wire import (
    MODEL_FIELDS,
    decode_varint,
    encode_varint,
    incomplete_error,
    unparsable_error,
)

__all__ = ["IN_FILE_MIN_BYTES", "Skimmed", "Span", "skim_file"]

IN_FILE_MIN_BYTES = 4096
"""Inline ``raw_data`` over this many bytes stays in the file. The engine reads the values of
tensors up to this size only (``graph.evaluate.VALUE_BYTES``, ``graph.shapes``' stripping bound),
so a tensor above it is never read during analysis, inline or not."""

_GRAPH = 7  # ModelProto.graph
_INITIALIZER = 5  # GraphProto.initializer
_NAME, _RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 8, 9, 13, 14  # TensorProto fields
_NOTED = frozenset({_NAME, _EXTERNAL_DATA, _DATA_LOCATION})


@dataclass(frozen=True, slots=True)
class Span:
    """A graph initializer whose ``raw_data`` was left in the file."""

    index: int
    """Its position in ``graph.initializer``."""
    offset: int
    """Of its first data byte in the file."""
    length: int
    explicit_default: bool
    """Its ``data_location`` field was written (as DEFAULT), so a faithful copy writes it again."""


@dataclass(frozen=True, slots=True)
class Skimmed:
    data: bytes
    """The file, re-encoded without the spans' ``raw_data`` fields."""
    spans: tuple[Span, ...]
    sha256: str
    """Of the whole file."""
    size: int


class _Corrupt(CorruptVarint):
    """Bytes protobuf refuses too: a field past its record's end, a wire type of 6 or 7, a varint
    over 64 bits."""


class _Group(Exception):
    """A group-encoded field (wire types 3, 4): valid protobuf for an unknown field, never an
    ONNX one. Its enclosing field is copied as it is, for protobuf to read."""


def _field(r: HashingReader) -> tuple[int, int, int] | None:
    """The next field's ``(number, wire type, size)``, its key and any length prefix consumed; a
    varint's bytes stay unread (its size is what it spans). None when the file ends first."""
    key = r.varint()
    if key is None:
        return None
    number, wire = key >> 3, key & 7
    if wire == 0:
        start = r.pos
        if r.varint() is None:
            return None
        size = r.pos - start
        r.i -= size  # the varint is still in the buffer: read again as the field's payload
        return number, wire, size
    if wire in (1, 5):
        return number, wire, 8 if wire == 1 else 4
    if wire == 2:
        length = r.varint()
        return None if length is None else (number, wire, length)
    raise _Group if wire in (3, 4) else _Corrupt


def _encoded(number: int, wire: int, payload: bytes) -> bytes:
    """The field as protobuf writes it (keys and lengths as minimal varints)."""
    head = encode_varint(number << 3 | wire)
    if wire == 2:
        head += encode_varint(len(payload))
    return head + payload


@dataclass(slots=True)
class _Walk:
    """One skim: the reader, the spans found so far, and how a cut file is reported."""

    r: HashingReader
    where: str
    spans: list[Span]
    initializers: int = 0
    complete: int = 0
    """Top-level fields read whole so far, all of them ``ModelProto``'s own (else -1), as
    ``wire.truncated_field`` tells a cut copy from random bytes."""

    def field(self) -> tuple[int, int, int]:
        """The next field in the graph (``_field``); the file ending first is a cut graph."""
        field = _field(self.r)
        if field is None:
            raise self.cut_graph()
        return field

    def cut_graph(self) -> ModelInvalidError:
        if self.complete > 0:
            return incomplete_error(self.where, "the model's graph field", self.r.size)
        return unparsable_error(self.where, "the file ends inside the graph field")


def skim_file(f: BufferedReader, size: int, where: str) -> Skimmed:
    """Skim the open model file ``f`` of ``size`` bytes (see module doc); ``where`` names it in errors."""
    walk = _Walk(HashingReader(f, size), where, [])
    r = walk.r
    out: list[bytes] = []
    while r.pos < size:
        start = r.pos
        try:
            field = _field(r)
        except (CorruptVarint, _Group):
            field = None
        if field is None or ((field[0], field[1]) != (_GRAPH, 2) and r.pos + field[2] > size):
            # cut short, or a group: the rest as it is, for protobuf (and ``wire.truncated_field``
            # on a cut copy) to judge as they judge the whole file
            out.append(r.reread(start, size))
            r.skip(size - r.pos)
            break
        number, wire, length = field
        if (number, wire) == (_GRAPH, 2):
            out.append(_graph(walk, start, length))
        else:
            payload = r.take(length)
            assert payload is not None  # it ends inside the file
            out.append(_encoded(number, wire, payload))
        known = MODEL_FIELDS.get(number)
        readable = walk.complete >= 0 and known is not None and known[1] == wire
        walk.complete = walk.complete + 1 if readable else -1
    return Skimmed(b"".join(out), tuple(walk.spans), r.sha.hexdigest(), size)


def _graph(walk: _Walk, key_start: int, length: int) -> bytes:
    """The graph field, its large initializers' data left out."""
    r = walk.r
    end = r.pos + length
    pieces: list[bytes] = []
    spans_before, initializers_before = len(walk.spans), walk.initializers
    try:
        while r.pos < end:
            # whole fields in the buffer, copied as they are (nodes, small initializers, values)
            r.fill()
            stop = min(len(r.buf), end - r.base)
            skipped, small = _scan(r.buf, r.i, stop)
            if r.keep(skipped, pieces):
                walk.initializers += small
                continue
            # a large initializer, a field across the buffer's end, or bytes the scan leaves
            number, wire, size = walk.field()
            _within(walk, r.pos + size, end)
            if number == _INITIALIZER and wire == 2:
                walk.initializers += 1
                if size > IN_FILE_MIN_BYTES:
                    pieces.append(_tensor(walk, walk.initializers - 1, size))
                    continue
            payload = r.take(size)
            if payload is None:
                raise walk.cut_graph()
            pieces.append(_encoded(number, wire, payload))
    except CorruptVarint:
        if end > r.size:
            raise walk.cut_graph() from None
        raise unparsable_error(
            walk.where, f"the graph field is corrupt near byte {r.pos}"
        ) from None
    except _Group:  # copied as it is
        del walk.spans[spans_before:]
        walk.initializers = initializers_before
        if end > r.size:
            raise walk.cut_graph() from None
        r.skip(end - r.pos)
        return r.reread(key_start, end)
    return _encoded(_GRAPH, 2, b"".join(pieces))


def _scan(buf: bytes, i: int, stop: int) -> tuple[int, int]:
    """Where the first field of ``buf[i:stop]`` that is not plainly copied starts (a large
    initializer, one that does not end by ``stop``, a wire type other than 0, 1, 2, 5), and how
    many initializers come before it. The hot loop of a 100k-node graph: one-byte varints (most
    keys, short lengths) are read in place."""
    count = 0
    while i < stop:
        start = i
        key = buf[i]
        i += 1
        if key & 0x80:  # a field over 15: a key of two bytes or more
            long_key, i = decode_varint(buf, start)
            if long_key is None or i >= stop:
                return start, count
            key = long_key
        wire = key & 7
        if wire == 2:
            if i >= stop:
                return start, count
            size = buf[i]
            i += 1
            if size & 0x80:
                long_size, i = decode_varint(buf, i - 1)
                if long_size is None or i > stop:
                    return start, count
                size = long_size
            if key == 0x2A:  # GraphProto.initializer
                if size > IN_FILE_MIN_BYTES:
                    return start, count
                count += 1
            i += size
        elif wire == 0:
            while i < stop and buf[i] & 0x80:
                i += 1
            i += 1
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            return start, count
        if i > stop:
            return start, count - (key == 0x2A)
    return i, count


def _within(walk: _Walk, field_end: int, record_end: int) -> None:
    """A field must end inside its record; in a cut file the cut is the finding."""
    if field_end > record_end:
        if record_end > walk.r.size:
            raise walk.cut_graph()
        raise _Corrupt


@dataclass(slots=True)
class _Tensor:
    """What the walk learns of one initializer's fields on the way to its data."""

    name: str | None = None
    location: int | None = None
    external: bool = False

    def note(self, number: int, wire: int, payload: bytes) -> None:
        if number == _NAME and wire == 2:
            self.name = payload.decode("utf-8", "replace")
        elif number == _DATA_LOCATION and wire == 0:
            self.location = decode_varint(payload, 0)[0]
        elif number == _EXTERNAL_DATA:
            self.external = True


def _tensor(walk: _Walk, index: int, length: int) -> bytes:
    """One initializer, its ``raw_data`` left in the file when that is plainly the tensor's data."""
    r = walk.r
    end = r.pos + length
    pieces: list[bytes] = []
    seen = _Tensor()
    raw: list[tuple[int, int, int]] = []  # (slot in pieces, offset, length)
    while r.pos < end:
        r.fill()
        # fields before the data, in the buffer: copied as they are
        if r.keep(_small_fields(r, min(len(r.buf), end - r.base), seen), pieces):
            continue
        number, wire, size = walk.field()
        if number == _RAW_DATA and wire == 2 and size > IN_FILE_MIN_BYTES:
            _check_data(walk, seen.name, index, r.pos, size, end)
            raw.append((len(pieces), r.pos, size))
            pieces.append(b"")
            r.skip(size)
            continue
        _within(walk, r.pos + size, end)
        payload = r.take(size)
        if payload is None:
            raise walk.cut_graph()
        seen.note(number, wire, payload)
        pieces.append(_encoded(number, wire, payload))
    if len(raw) == 1 and not seen.external and seen.location in (None, 0):
        _, offset, size = raw[0]
        walk.spans.append(Span(index, offset, size, seen.location == 0))
    else:  # not plainly inline data: every byte is kept, for protobuf and the loader to judge
        for slot, offset, size in raw:
            pieces[slot] = _encoded(_RAW_DATA, 2, r.reread(offset, offset + size))
    return _encoded(_INITIALIZER, 2, b"".join(pieces))


def _small_fields(r: HashingReader, stop: int, seen: _Tensor) -> int:
    """Where the first field from ``r.pos`` that is not small and whole before ``stop`` starts
    (the data, usually), noting each one before it in ``seen``."""
    buf, i = r.buf, r.i
    while i < stop:
        start = i
        key, i = decode_varint(buf, i)
        if key is None or key & 7 not in (0, 1, 2, 5):
            return start
        wire = key & 7
        if wire == 2:
            size, i = decode_varint(buf, i)
            if size is None or (key >> 3 == _RAW_DATA and size > IN_FILE_MIN_BYTES):
                return start
            payload_start, i = i, i + size
        elif wire == 0:
            payload_start = i
            value, i = decode_varint(buf, i)
            if value is None:
                return start
        else:
            payload_start, i = i, i + (8 if wire == 1 else 4)
        if i > stop:
            return start
        if key >> 3 in _NOTED:
            seen.note(key >> 3, wire, buf[payload_start:i])
    return i


def _check_data(
    walk: _Walk, name: str | None, index: int, offset: int, length: int, record_end: int
) -> None:
    """Refuse data that cannot be the tensor's: past the end of the file, or of its own record."""
    label = repr(name) if name is not None else f"#{index} (its name is written after its data)"
    size = walk.r.size
    end = offset + length
    if end > size and record_end > size:
        raise incomplete_error(walk.where, f"the data of initializer {label}", size)
    if end > size:
        raise ModelInvalidError(
            f"{walk.where} is corrupt: the data of initializer {label} would run to byte {end}, "
            f"past the end of the file ({size} bytes)",
        )
    if end > record_end:
        raise ModelInvalidError(
            f"{walk.where} is corrupt: the data of initializer {label} (bytes {offset}..{end}) runs "
            f"past the end of the tensor's own record (byte {record_end}), into the fields after it",
        )
