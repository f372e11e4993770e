"""Artifacts crossing ``shared_dir``: sealed on the node (fsync + rename), checked by the daemon.

A node writes under a temporary name, fsyncs every file and its folder, renames to the final name
and reports size and sha256; the daemon recomputes both before it takes the artifact, so a partial
file (a node that died mid-write, a stale NFS view) or a corrupted one is never published.
A folder artifact (onnxruntime's per-stage models) is digested over its sorted relative paths and
file contents.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sharderd.fsutil import fsync_dir

__all__ = ["TMP_PREFIX", "Digest", "digest", "fsync_tree", "seal"]

TMP_PREFIX: Final = ".tmp-"
_CHUNK: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Digest:
    size: int
    """Bytes: the file's size, or the sum over a folder's files."""
    sha256: str


def digest(path: Path) -> Digest:
    """Size and sha256 of a file, or of a folder's files in sorted path order (links are refused)."""
    h = hashlib.sha256()
    size = 0
    for rel, file in _files(path):
        if rel:
            h.update(rel.encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        if rel:
            h.update(b"\0")
    return Digest(size, h.hexdigest())


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and folder under a folder, then the parent folder."""
    for _, file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if path.is_dir():
        for folder in [path, *(p for p in sorted(path.rglob("*")) if p.is_dir())]:
            fsync_dir(folder)
    fsync_dir(path.parent)


def seal(written: Path, final: Path) -> Digest:
    """Make ``written`` durable, rename it to ``final`` and return its digest."""
    fsync_tree(written)
    written.replace(final)
    fsync_dir(final.parent)
    return digest(final)


def _files(path: Path) -> list[tuple[str, Path]]:
    if path.is_symlink():
        raise ValueError(f"artifact {path} is a symbolic link")
    if path.is_file():
        return [("", path)]
    if not path.is_dir():
        raise FileNotFoundError(path)
    out = []
    for file in sorted(path.rglob("*")):
        if file.is_symlink():
            raise ValueError(f"artifact {file} is a symbolic link")
        if file.is_file():
            out.append((file.relative_to(path).as_posix(), file))
    return out
