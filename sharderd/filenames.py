"""File names as the filesystem has them (any bytes), as text, and as the names sharderd gives.

Linux allows any bytes but ``/`` and NUL in a name, up to 255 of them. Python hands a name that is
not UTF-8 over with each stray byte as a lone surrogate (``os.fsdecode``'s ``surrogateescape``);
such a ``str`` opens the file fine, but strict UTF-8 refuses it: a log line, report.json,
error.md, a protobuf string. So a name takes one of three forms, depending on where it goes:

- ``text(s)``: for logs, reports and messages. Each byte that is not UTF-8 is shown as ``%XX``;
  everything else (a newline too: JSON escapes it) is kept.
- ``safe_name(name)``: the name of what sharderd makes of a job (its ``outbox/``, ``failed/`` and
  ``done/`` folders, the stem of the files it writes). ``text``, with control characters as ``%XX``
  too, and at most ``MAX_NAME_BYTES``: a longer one keeps its start and ends in ``-`` and 8 hex
  digits of the sha256 of the original bytes. A name that is already safe is unchanged. Two inputs
  may share a safe name (``%E9`` typed, or the latin-1 byte): the folder that comes second gets
  ``-1``, like any taken name, and the original bytes are in its report.json (``job.entry_hex``).
- ``shell_word(s)``: one word of a command that bash runs as written, whatever the bytes:
  ``shlex.quote`` for a printable UTF-8 word, else ``$'...'`` with ``\\xNN`` escapes.

No sharderd imports: the engine's writers use it too.
"""

from __future__ import annotations

import hashlib
import shlex
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_NAME_BYTES", "raw_bytes", "safe_name", "shell_word", "text", "text_values"]

NAME_MAX: Final = 255
"""Linux's limit on one name, in bytes (ext4, xfs, btrfs, tmpfs)."""
MAX_NAME_BYTES: Final = 200
"""Longest name sharderd gives: ``NAME_MAX`` less room for what it appends to one, the longest
being an output file's suffix (``.serialized<n>.data``, 20 bytes at n < 1000) and a taken name's
``-<n>`` (5), with the rest as margin for filesystems that count a little less."""
_HASH_HEX: Final = 8
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Zl", "Zp"})
"""Control characters and the line/paragraph separators: each breaks a line-based tool."""


def raw_bytes(name: str) -> bytes:
    """The bytes of a name as the filesystem has them (``os.fsencode`` on Linux)."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no filesystem gave: keep it visible
        return name.encode("utf-8", "surrogatepass")


def text(value: str) -> str:
    """``value`` with each byte that is not UTF-8 shown as ``%XX``; valid text is returned as is."""
    if value.isascii() or not any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return value
    return "".join(_pieces(value, controls=False))


def text_values(value: Any) -> Any:
    """``value`` with ``text`` applied to every string in it, keys too (mappings and sequences
    become dicts and lists): what goes into a JSON file or a log line."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return {text_values(k): text_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [text_values(v) for v in value]
    return value


def safe_name(name: str, limit: int = MAX_NAME_BYTES) -> str:
    """The name sharderd gives what it makes of ``name``: printable UTF-8, at most ``limit`` bytes."""
    pieces = _pieces(name, controls=True)
    safe = "".join(pieces)
    if len(safe.encode()) <= limit:
        return safe
    digest = hashlib.sha256(raw_bytes(name)).hexdigest()[:_HASH_HEX]
    room = limit - 1 - _HASH_HEX
    kept: list[str] = []
    for piece in pieces:  # whole pieces only: never half a character or half a ``%XX``
        room -= len(piece.encode())
        if room < 0:
            break
        kept.append(piece)
    return f"{''.join(kept)}-{digest}"


def shell_word(word: str) -> str:
    """``word`` quoted so that bash passes exactly its bytes to the command."""
    raw = raw_bytes(word)
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and all(
        unicodedata.category(c) not in _UNSAFE_CATEGORIES for c in decoded
    ):
        return shlex.quote(decoded)
    out = []
    for ch in raw.decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch in "\\'":
            out.append("\\" + ch)
        elif unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def _pieces(name: str, *, controls: bool) -> list[str]:
    """``name`` one character each, the ones not shown as they are as ``%XX`` per byte."""
    out = []
    for ch in raw_bytes(name).decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            out.append("".join(f"%{b:02X}" for b in raw_bytes(ch)))
        elif controls and unicodedata.category(ch) in _UNSAFE_CATEGORIES:
            out.append("".join(f"%{b:02X}" for b in ch.encode()))
        else:
            out.append(ch)
    return out
