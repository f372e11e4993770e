"""Forward reads of a file through a bounded buffer, every byte hashed once, in order: the reader
``graph.skim`` walks a model file with."""

from __future__ import annotations

import hashlib
import os
from io import BufferedReader

__all__ = ["CHUNK", "CorruptVarint", "HashingReader"]

CHUNK = 1 << 20
"""Read size: the buffer holds about one chunk, plus a field being copied that is longer."""


class CorruptVarint(Exception):
    """A varint of more than 64 bits: no protobuf reader accepts it."""


class HashingReader:
    """Forward reads through a bounded buffer; every byte of the file is hashed once, in order."""

    def __init__(self, f: BufferedReader, size: int) -> None:
        self.f, self.size = f, size
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.i = 0
        self.sha = hashlib.sha256()

    @property
    def pos(self) -> int:
        return self.base + self.i

    def _have(self, n: int) -> bool:
        """Make ``n`` bytes from ``pos`` available in the buffer; False when the file ends first."""
        if self.i + n <= len(self.buf):
            return True
        rest = self.buf[self.i :]
        self.base += self.i
        new = self.f.read(min(max(n - len(rest), CHUNK), self.size - self.base - len(rest)))
        self.sha.update(new)
        self.buf, self.i = rest + new, 0
        return n <= len(self.buf)

    def fill(self) -> None:
        """Refill the buffer when little of it is left (no copying of a long rest per call)."""
        if len(self.buf) - self.i < CHUNK // 16:
            self._have(CHUNK)

    def keep(self, upto: int, pieces: list[bytes]) -> bool:
        """Consume the buffer up to index ``upto``, appending those bytes to ``pieces``; False
        when that is nothing."""
        if upto <= self.i:
            return False
        pieces.append(self.buf[self.i : upto])
        self.i = upto
        return True

    def varint(self) -> int | None:
        """A varint at ``pos`` (consumed), or None when the file ends inside it."""
        self._have(10)
        buf, i, value, shift = self.buf, self.i, 0, 0
        while i < len(buf) and shift < 64:
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.i = i
                return value
            shift += 7
        if shift >= 64:
            raise CorruptVarint
        return None

    def take(self, n: int) -> bytes | None:
        if not self._have(n):
            return None
        out = self.buf[self.i : self.i + n]
        self.i += n
        return out

    def skip(self, n: int) -> bool:
        """Consume ``n`` bytes without keeping them; False when the file ends first."""
        held = len(self.buf) - self.i
        if n <= held:
            self.i += n
            return True
        self.base += len(self.buf)
        self.buf, self.i = b"", 0
        left = n - held
        chunk = bytearray(min(CHUNK, left))
        view = memoryview(chunk)
        while left:
            got = self.f.readinto(view[: min(len(chunk), left)])
            if not got:
                return False
            self.sha.update(view[:got])
            self.base += got
            left -= got
        return True

    def reread(self, start: int, end: int) -> bytes:
        """Bytes already consumed, read again (not hashed again)."""
        return os.pread(self.f.fileno(), end - start, start)
