"""A power cut at any point of a real ``sharderd run``: what survives is what was fsynced.

``traced(root)`` gives the environment that makes a daemon (and only the daemon, not its workers)
log every change it makes under ``root`` to ``root.trace``: each ``mkdir``, ``rename`` (the
``renameat2`` of ``rename_unique`` too), ``link``, ``unlink``, ``rmdir``, each file opened for
writing and each ``fsync``, with the inode it concerned; a file's bytes are kept when it is deleted
or replaced. ``Oracle`` replays such a trace, keeping two views of every folder: its entries now,
and its entries as of its last fsync; and for every file, whether its bytes were fsynced since its
last write. ``materialize(trace, k, final, root)`` then builds at ``root`` the tree a power cut
after the first ``k`` operations leaves, from the run's final tree ``final``:

- a folder holds the entries it held at its last fsync (an entry's parent must be reached that way
  too, or the entry is gone: it lands in ``lost+found/``, as after fsck);
- a file whose bytes were written and not fsynced since is empty ("every byte not yet fsynced is
  dropped");
- a rename never leaves two names: a file or folder reached under two names keeps the one it had
  at the cut (a journaling filesystem commits a rename whole);
- whatever the daemon never touched (the model a test dropped, files its workers wrote) is taken
  as it is in the final tree, durable.

This is stricter than ext4 (whose journal commits every earlier metadata change with any fsync)
and models what POSIX promises: only an fsync of a folder makes its entries durable.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharderd.fsutil import fsync_dir

HOOK = r"""
import base64, builtins, io, json, os, stat, sys

_TRACE = os.environ.get("SHARDERD_TRACE")
if _TRACE and "sharderd.cli" in sys.orig_argv and "run" in sys.argv:
    _ROOT = os.environ["SHARDERD_TRACE_ROOT"].rstrip("/") + "/"
    _o = {n: getattr(os, n) for n in (
        "open", "mkdir", "rename", "replace", "link", "unlink", "remove", "rmdir", "fsync",
        "write", "lstat", "fstat", "readlink", "getcwd")}
    _bopen = builtins.open
    _fd = _o["open"](_TRACE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    _busy = [False]

    def _log(**op):
        _o["write"](_fd, (json.dumps(op) + "\n").encode())

    def _abs(path, dir_fd=None):
        path = os.fsdecode(os.fspath(path))
        if not os.path.isabs(path):
            base = _o["readlink"](f"/proc/self/fd/{dir_fd}") if dir_fd is not None else _o["getcwd"]()
            path = os.path.join(base, path)
        return os.path.normpath(path)

    def _in(path):
        return path.startswith(_ROOT) or path == _ROOT[:-1]

    def _stat(path):
        try:
            st = _o["lstat"](path)
        except OSError:
            return None, False
        return st.st_ino, stat.S_ISDIR(st.st_mode)

    def _snap(path):
        try:
            st = _o["lstat"](path)
            if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
                with _bopen(path, "rb") as f:
                    return base64.b64encode(f.read()).decode()
        except OSError:
            pass
        return None

    def mkdir(path, mode=0o777, *, dir_fd=None):
        _o["mkdir"](path, mode, dir_fd=dir_fd)
        p = _abs(path, dir_fd)
        if _in(p):
            _log(op="mkdir", path=p, ino=_stat(p)[0])

    def _renamer(name):
        def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
            s, d = _abs(src, src_dir_fd), _abs(dst, dst_dir_fd)
            watched = not _busy[0] and (_in(s) or _in(d))
            if watched:
                ino, isdir = _stat(s)
                old = _stat(d)[0]
                snap = _snap(d) if old is not None else None
            _o[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            if watched:
                _log(op="rename", src=s, dst=d, ino=ino, dir=isdir, replaced=old, snapshot=snap)
        return rename

    def link(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        _o["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                   follow_symlinks=follow_symlinks)
        s, d = _abs(src, src_dir_fd), _abs(dst, dst_dir_fd)
        if _in(d):
            _log(op="link", src=s, dst=d, ino=_stat(d)[0])

    def _unlinker(name):
        def unlink(path, *, dir_fd=None):
            p = _abs(path, dir_fd)
            if _in(p):
                ino, _ = _stat(p)
                snap = _snap(p)
            _o[name](path, dir_fd=dir_fd)
            if _in(p):
                _log(op="unlink", path=p, ino=ino, snapshot=snap)
        return unlink

    def rmdir(path, *, dir_fd=None):
        p = _abs(path, dir_fd)
        ino = _stat(p)[0] if _in(p) else None
        _o["rmdir"](path, dir_fd=dir_fd)
        if _in(p):
            _log(op="rmdir", path=p, ino=ino)

    def fsync(fd):
        _o["fsync"](fd)
        try:
            p = _o["readlink"](f"/proc/self/fd/{fd}")
        except OSError:
            return
        if _in(p):
            st = _o["fstat"](fd)
            _log(op="fsync", path=p, ino=st.st_ino, dir=stat.S_ISDIR(st.st_mode))

    def _written(p, fd, existed):
        if _in(p):
            _log(op="write", path=p, ino=_o["fstat"](fd).st_ino, created=existed is None)

    def open_(path, flags, mode=0o777, *, dir_fd=None):
        writes = flags & (os.O_WRONLY | os.O_RDWR) and flags & (os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        p = _abs(path, dir_fd) if writes else None
        existed = _stat(p)[0] if writes else None
        fd = _o["open"](path, flags, mode, dir_fd=dir_fd)
        if writes:
            _written(p, fd, existed)
        return fd

    def bopen(file, mode="r", *args, **kwargs):
        if isinstance(file, int) or not any(c in mode for c in "wax+"):
            return _bopen(file, mode, *args, **kwargs)
        p = _abs(file)
        existed = _stat(p)[0]
        f = _bopen(file, mode, *args, **kwargs)
        _written(p, f.fileno(), existed)
        return f

    os.mkdir, os.link, os.rmdir, os.fsync, os.open = mkdir, link, rmdir, fsync, open_
    os.rename, os.replace = _renamer("rename"), _renamer("replace")
    os.unlink, os.remove = _unlinker("unlink"), _unlinker("remove")
    builtins.open = io.open = bopen

    import sharderd.daemon.outbox as _outbox
    import sharderd.daemon.journal as _journal
    _noreplace = _outbox._rename_noreplace

    def _rename_noreplace(src, dst):
        s, d = _abs(src), _abs(dst)
        ino, isdir = _stat(s)
        _busy[0] = True
        try:
            done = _noreplace(src, dst)
        finally:
            _busy[0] = False
        if done:
            _log(op="rename", src=s, dst=d, ino=ino, dir=isdir, replaced=None, snapshot=None)
        return done

    _outbox._rename_noreplace = _rename_noreplace
    for _name in ("record", "remember"):
        def _marked(*args, _f=getattr(_journal.Journal, _name), _what=_name):
            first = args[1]
            mark = {"job_id": first.job_id, "state": first.state} if _what == "record" else {"sha256": first}
            _log(op="mark", what=_what, **mark)
            result = _f(*args)
            _log(op="mark", what=_what + "ed", **mark)
            return result
        setattr(_journal.Journal, _name, _marked)
"""
"""The ``sitecustomize`` that traces the daemon process (``traced``)."""


def traced(root: Path) -> dict[str, str]:
    """Environment for ``DaemonProcess``: trace what it changes under ``root`` into ``root.trace``."""
    hooks = root.parent / f"{root.name}.hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(HOOK)
    repo = Path(__file__).resolve().parent.parent
    return {
        "PYTHONPATH": os.pathsep.join([str(hooks), str(repo)]),
        "SHARDERD_TRACE": str(trace_path(root)),
        "SHARDERD_TRACE_ROOT": str(root),
    }


def trace_path(root: Path) -> Path:
    return root.parent / f"{root.name}.trace"


def drop_traced(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` and fsync both folders, as a careful writer (the test, not the
    daemon) does, into the trace: a cut before it finds the model where it was."""
    root = dst.parent.parent
    rename = {"op": "rename", "src": str(src), "dst": str(dst), "dir": False}
    rename |= {"ino": src.lstat().st_ino, "replaced": None, "snapshot": None}
    src.rename(dst)
    ops = [rename]
    for folder in (dst.parent, src.parent):
        fsync_dir(folder)
        ops.append({"op": "fsync", "path": str(folder), "ino": folder.stat().st_ino, "dir": True})
    with trace_path(root).open("a") as f:
        f.write("".join(json.dumps(op) + "\n" for op in ops))


def load_trace(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace_path(root).read_text().splitlines() if line]


@dataclass(slots=True)
class _Node:
    id: int
    dir: bool
    ino: int | None
    vol: dict[str, int] = field(default_factory=dict)
    dur: dict[str, int] = field(default_factory=dict)
    synced: bool = True
    """Its bytes were fsynced since its last write (files)."""
    snapshot: bytes | None = None
    """Its bytes when it was deleted or replaced."""
    links: set[tuple[int, str]] = field(default_factory=set)
    """Where it is now: (folder id, name)."""
    names: set[str] = field(default_factory=set)
    """Every name the trace ever saw in it (folders): the rest of it the daemon never touched."""
    original: bool = False
    """It was there before the trace began (found by path, under folders that were too)."""


class Oracle:
    """The tree under ``root`` as a trace changes it: entries now and entries as last fsynced."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.nodes: list[_Node] = [_Node(0, True, None, original=True)]
        self.by_ino: dict[int, int] = {}
        self.discovered: list[tuple[str, bool, int | None]] = []
        """``(path, is_dir, ino)`` of each entry found there before the trace began."""

    def seed(self, path: str, is_dir: bool, ino: int | None) -> None:
        """An entry that was there before the trace began (``discovered`` by an earlier replay)."""
        parent, name = self._parent(path)
        self._child(parent, name, is_dir, ino)

    # -- replay -------------------------------------------------------------------------------

    def apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "mkdir":
            self._add(op["path"], self._new(True, op["ino"]))
        elif kind == "write":
            parent, name = self._parent(op["path"])
            current = self.nodes[parent].vol.get(name)
            node = current
            if current is None or (op["ino"] is not None and self.nodes[current].ino != op["ino"]):
                node = self._new(False, op["ino"])
                self._add(op["path"], node)
            self.nodes[node].synced = False
        elif kind == "fsync":
            node = self._find(op["path"], op["ino"], op["dir"])
            if self.nodes[node].dir:
                self.nodes[node].dur = dict(self.nodes[node].vol)
            else:
                self.nodes[node].synced = True
        elif kind == "rename":
            node = self._find(op["src"], op["ino"], op["dir"])
            self._drop(op["src"])
            replaced = self._drop(op["dst"])
            if replaced is not None and op["snapshot"] is not None:
                self.nodes[replaced].snapshot = base64.b64decode(op["snapshot"])
            self._add(op["dst"], node)
        elif kind == "link":
            self._add(op["dst"], self._find(op["src"], op["ino"], False))
        elif kind in ("unlink", "rmdir"):
            node = self._drop(op["path"])
            if node is not None and op.get("snapshot") is not None:
                self.nodes[node].snapshot = base64.b64decode(op["snapshot"])

    def _new(self, is_dir: bool, ino: int | None) -> int:
        node = _Node(len(self.nodes), is_dir, ino)
        self.nodes.append(node)
        if ino is not None:
            self.by_ino[ino] = node.id
        return node.id

    def _parts(self, path: str) -> list[str]:
        rel = os.path.relpath(path, self.root)
        return [] if rel == "." else list(Path(rel).parts)

    def _parent(self, path: str) -> tuple[int, str]:
        *parents, name = self._parts(path)
        node = 0
        for part in parents:
            node = self._child(node, part, True)
        return node, name

    def _child(self, parent: int, name: str, is_dir: bool, ino: int | None = None) -> int:
        """``parent``'s entry ``name``; one the trace never made existed before it: durable."""
        found = self.nodes[parent].vol.get(name)
        if found is None:
            found = self._new(is_dir, ino)
            self.nodes[parent].vol[name] = self.nodes[parent].dur[name] = found
            self.nodes[found].links.add((parent, name))
            self.nodes[parent].names.add(name)
            if self.nodes[parent].original:
                self.nodes[found].original = True
                path = self.path_of(found)
                assert path is not None
                self.discovered.append((path, is_dir, ino))
        elif ino is not None and self.nodes[found].ino is None:
            self.nodes[found].ino = ino
            self.by_ino[ino] = found
        return found

    def _find(self, path: str, ino: int | None, is_dir: bool) -> int:
        if ino is not None and ino in self.by_ino:
            return self.by_ino[ino]
        parts = self._parts(path)
        if not parts:
            return 0
        parent, name = self._parent(path)
        return self._child(parent, name, is_dir, ino)

    def _add(self, path: str, node: int) -> None:
        parent, name = self._parent(path)
        self.nodes[parent].vol[name] = node
        self.nodes[parent].names.add(name)
        self.nodes[node].links.add((parent, name))

    def _drop(self, path: str) -> int | None:
        parent, name = self._parent(path)
        node = self.nodes[parent].vol.pop(name, None)
        if node is not None:
            self.nodes[node].links.discard((parent, name))
        return node

    # -- the tree a cut leaves ----------------------------------------------------------------

    def path_of(self, node: int) -> str | None:
        """Where ``node`` is now (one of its names), None when it has none."""
        parts: list[str] = []
        seen = set()
        while node != 0:
            if not self.nodes[node].links or node in seen:
                return None
            seen.add(node)
            parent, name = sorted(self.nodes[node].links)[0]
            parts.append(name)
            node = parent
        return str(Path(self.root).joinpath(*reversed(parts)))

    def durable_links(self) -> dict[int, list[tuple[int, str]]]:
        """Each node's names that survive: its durable entries reached from the root, a rename
        kept whole (the name it has now wins over an older durable one)."""
        found: dict[int, list[tuple[int, str]]] = {}
        stack = [0]
        visited = {0}
        while stack:
            folder = stack.pop()
            for name, child in sorted(self.nodes[folder].dur.items()):
                found.setdefault(child, []).append((folder, name))
                if self.nodes[child].dir and child not in visited:
                    visited.add(child)
                    stack.append(child)
        for node, links in found.items():
            current = [link for link in links if link in self.nodes[node].links]
            found[node] = current or links[:1]
        return found


def replay(root: Path, trace: list[dict[str, Any]], upto: int | None = None) -> Oracle:
    """The oracle after ``trace[:upto]``, knowing from the start every entry the whole trace found
    already there (a model dropped before the daemon touched it is there at any cut)."""
    probe = Oracle(root)
    for op in trace:
        probe.apply(op)
    oracle = Oracle(root)
    for path, is_dir, ino in probe.discovered:
        oracle.seed(path, is_dir, ino)
    for op in trace[:upto]:
        oracle.apply(op)
    return oracle


def materialize(trace: list[dict[str, Any]], k: int, final: Path, root: Path) -> list[Path]:
    """Build at ``root`` (absent) what a power cut after ``trace[:k]`` leaves, reading bytes from
    ``final`` (the run's end state, moved away from ``root``); returns what went to lost+found."""
    whole = replay(root, trace)
    cut = replay(root, trace, k)
    links = cut.durable_links()
    made: dict[int, Path] = {}

    def source(node: int) -> bytes:
        if not cut.nodes[node].synced:
            return b""
        snapshot = whole.nodes[node].snapshot
        now = whole.path_of(node)
        if now is not None:
            path = final / os.path.relpath(now, root)
            ino = whole.nodes[node].ino
            if path.is_file() and (ino is None or path.lstat().st_ino == ino):
                return path.read_bytes()
        return snapshot or b""

    def build(folder: int, path: Path, final_dir: Path | None) -> None:
        path.mkdir(exist_ok=True)
        known = whole.nodes[folder].names
        for name, child in sorted(cut.nodes[folder].dur.items()):
            if (folder, name) not in links.get(child, []):
                continue
            _make(child, path / name)
        if final_dir is not None and final_dir.is_dir():  # what the daemon never touched
            for entry in final_dir.iterdir():
                if entry.name not in known and not (path / entry.name).exists():
                    _copy(entry, path / entry.name)

    def _make(node: int, path: Path) -> None:
        if node in made:
            os.link(made[node], path)
            return
        if cut.nodes[node].dir:
            now = whole.path_of(node)
            build(node, path, None if now is None else final / os.path.relpath(now, root))
        else:
            path.write_bytes(source(node))
        made[node] = path

    root.mkdir(parents=True)
    build(0, root, final)
    lost = []
    for node in range(1, len(cut.nodes)):
        if node in links or not cut.nodes[node].links:
            continue
        if not cut.nodes[node].dir:
            lost_found = root / "lost+found"
            lost_found.mkdir(exist_ok=True)
            target = lost_found / f"#{node}"
            target.write_bytes(source(node))
            lost.append(target)
    return lost


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def cuts(trace: list[dict[str, Any]]) -> Iterator[int]:
    """Every point worth cutting at: after each operation that changes what survives."""
    for k, op in enumerate(trace, start=1):
        if op["op"] != "mark":
            yield k
