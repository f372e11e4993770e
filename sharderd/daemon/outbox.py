"""Results and failures land whole or not at all, under names that never overwrite.

A result is built in ``outbox/.tmp-<job_id>/`` (a dotfile: watchers on the outbox skip it), every
file and folder fsynced, then renamed to ``outbox/<name>/``; a taken name gets ``-1``, ``-2``...
The rename uses ``renameat2(RENAME_NOREPLACE)`` so not even an empty folder someone made is
replaced; on filesystems without it (older NFS) it falls back to look-then-rename, where only an
empty directory appearing in between could be replaced (a published result is never empty: it holds
the ``.sharderd-job`` marker that lets crash recovery find it). Failed jobs move whole to
``failed/<name>/`` with ``error.json`` for tools and ``error.md`` for people.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sharderd.errors import SharderdError
from sharderd.filenames import shell_word, text, text_values
from sharderd.fsutil import fsync_dir
from sharderd.isotime import iso_time

__all__ = [
    "JOB_MARKER",
    "TMP_PREFIX",
    "fail_job",
    "find_published",
    "publish",
    "relocated",
    "rename_unique",
    "tmp_dir_for",
]

TMP_PREFIX: Final = ".tmp-"
JOB_MARKER: Final = ".sharderd-job"
"""File in every published result holding the job id; recovery uses it to avoid publishing twice."""
_MAX_SUFFIX: Final = 10_000

_ADVICE: Final[Mapping[str, str]] = {
    "bad_config": "Fix the sidecar (.toml) named above, then move the model and sidecar back into the inbox.",
    "bad_model": "Re-export the model (or copy it again, whole), then retry it.",
    "bad_job": "Make the job a single `<name>.onnx` file, or a folder holding exactly one `.onnx` with its external data, then move it back into the inbox.",
    "does_not_fit": "Give the job more devices (sidecar `devices = N`) or a smaller batch size, then move it back into the inbox.",
    "not_proven": "No split was found but none is proven impossible: give the job more devices (sidecar `devices = N`, N as measured above) or more compile attempts (`max_attempts`), then move it back into the inbox.",
    "backend_unavailable": "Install the backend on this host or choose another one (sidecar `backend = ...`).",
    "compile_failed": "Read the compiler output in error.json; if it is a bug, report it with that file attached.",
    "verification_failed": "The sharded model computes different results; report this with the model attached.",
    "worker_crashed": "The worker process crashed repeatedly (see the signal in error.json); check memory limits and the compiler log.",
    "timeout": "Compiling took longer than `attempt_timeout`; raise it in sharderd.toml or give the job more devices.",
}
_DEFAULT_ADVICE: Final = "Read error.json for details."
_REPRODUCIBLE: Final = frozenset({"bad_model"})
"""Reasons ``sharderd plan`` shows again from the failed folder, so error.md gives that command."""


def tmp_dir_for(outbox: Path, job_id: str) -> Path:
    """Create (or empty-reuse) ``outbox/.tmp-<job_id>`` where a result is assembled."""
    path = outbox / f"{TMP_PREFIX}{job_id}"
    path.mkdir(exist_ok=True)
    return path


def publish(
    tmp_dir: Path, outbox: Path, name: str, *, file_mode: int = 0o640, dir_mode: int = 0o750
) -> Path:
    """Make the result in ``tmp_dir`` durable and visible as ``outbox/<name>`` (or a suffixed name)."""
    if tmp_dir.parent != outbox or not tmp_dir.name.startswith(TMP_PREFIX):
        raise ValueError(f"{tmp_dir} is not an {outbox}/{TMP_PREFIX}<job_id> folder")
    (tmp_dir / JOB_MARKER).write_text(
        tmp_dir.name.removeprefix(TMP_PREFIX) + "\n", encoding="utf-8"
    )
    _sync_tree(tmp_dir, file_mode, dir_mode)
    return rename_unique(tmp_dir, outbox, name)


def find_published(outbox: Path, name: str, job_id: str) -> Path | None:
    """The result ``publish`` made for ``job_id`` under ``name`` or a suffixed name, if any."""
    pattern = re.compile(re.escape(name) + r"(-\d+)?")
    with os.scandir(outbox) as entries:
        hits = sorted(e.path for e in entries if pattern.fullmatch(e.name))
    for hit in hits:
        try:
            if (Path(hit) / JOB_MARKER).read_text(encoding="utf-8").strip() == job_id:
                return Path(hit)
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None


def fail_job(
    processing_job_dir: Path,
    failed_dir: Path,
    name: str,
    error: SharderdError | Mapping[str, Any],
    *,
    model: Path | None = None,
    config_path: Path | None = None,
    now: float | None = None,
    file_mode: int = 0o640,
    dir_mode: int = 0o750,
) -> Path:
    """Move a job's folder to ``failed/<name>`` with ``error.json`` and ``error.md`` inside.

    The two files are written and fsynced before the move, so the failed folder appears complete.
    They name paths where the files will be, not ``processing/<job_id>/`` (gone after the move):
    the folder's name is the first free one, and should another process take it meanwhile, the
    files are written again under the name the move got. ``model`` (the input's path in
    ``processing_job_dir``) and ``config_path`` (the daemon's) make the advice runnable commands.
    They and the folder get ``file_mode``/``dir_mode`` whatever the umask; the input keeps its own.
    """
    info: dict[str, Any] = dict(error.to_dict() if isinstance(error, SharderdError) else error)
    info.setdefault("reason", "error")
    info.setdefault("message", "the job failed")
    info.setdefault("hint", None)
    info.setdefault("exit_code", 1)
    info["job_id"] = processing_job_dir.name
    info["name"] = name
    info["time"] = iso_time(time.time() if now is None else now)
    failed_dir.mkdir(parents=True, exist_ok=True)
    held = sorted(p.name for p in processing_job_dir.iterdir() if not p.name.startswith("."))
    files = _FailureFiles(processing_job_dir, info, held, model, config_path, file_mode)
    planned = _first_free(failed_dir, name)
    files.write(processing_job_dir, planned)
    processing_job_dir.chmod(dir_mode)
    fsync_dir(processing_job_dir)
    dest = rename_unique(processing_job_dir, failed_dir, name)
    if dest != planned:  # another process took the name in between: say where the files really are
        files.write(dest, dest)
        fsync_dir(dest)
    return dest


@dataclass(frozen=True, slots=True)
class _FailureFiles:
    """``error.json`` and ``error.md`` of one failed job, for the folder it will be moved to."""

    source: Path
    info: Mapping[str, Any]
    held: list[str]
    """What the job's folder holds besides the two files (input, sidecar, reports)."""
    model: Path | None
    config_path: Path | None
    mode: int

    def write(self, folder: Path, dest: Path) -> None:
        info = text_values(relocated(self.info, self.source, dest))
        model = None if self.model is None else dest / self.model.relative_to(self.source)
        _write_synced(
            folder / "error.json",
            json.dumps(info, indent=2, sort_keys=True, default=str) + "\n",
            self.mode,
        )
        _write_synced(
            folder / "error.md",
            _error_md(info, dest, self.held, model, self.config_path),
            self.mode,
        )


def relocated(value: Any, source: Path, dest: Path) -> Any:
    """``value`` with every mention of the ``processing/<job_id>`` folder pointing at ``dest``."""
    if isinstance(value, str):
        return value.replace(str(source), str(dest))
    if isinstance(value, Mapping):
        return {k: relocated(v, source, dest) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [relocated(v, source, dest) for v in value]
    return value


def _first_free(parent: Path, name: str) -> Path:
    """The name ``rename_unique`` will take unless someone else takes it first."""
    for k in range(_MAX_SUFFIX):
        dest = parent / (name if k == 0 else f"{name}-{k}")
        if not os.path.lexists(dest):
            return dest
    return parent / name


def _command(
    command: tuple[str, ...],
    operands: tuple[str | Path, ...],
    options: tuple[str | Path | None, ...],
) -> str:
    """A command bash runs as written: each word quoted (``filenames.shell_word``: any bytes);
    ``command operands options``, or, when an operand starts with ``-`` (a name, never an option),
    ``command options -- operands``."""
    if any(str(o).startswith("-") for o in operands):
        words = (*command, *options, "--", *operands)
    else:
        words = (*command, *operands, *options)
    return "`" + " ".join(shell_word(str(w)) for w in words if w is not None) + "`"


def _error_md(
    info: Mapping[str, Any],
    dest: Path,
    held: list[str],
    model: Path | None,
    config_path: Path | None,
) -> str:
    core = ("reason", "message", "hint", "exit_code", "job_id", "name", "time")
    config = ("--config", config_path) if config_path is not None else (None, None)
    advice = info["hint"] or _ADVICE.get(str(info["reason"]), _DEFAULT_ADVICE)
    if info["reason"] in ("does_not_fit", "not_proven") and info.get("min_devices"):
        # The CLI's "--devices N" is no daemon command: say it as the sidecar line that does it.
        advice = (
            f"Set `devices = {info['min_devices']}` in the job's sidecar (`{info['name']}.toml`, or "
            "`sharderd.toml` inside a folder job), then move the job back into the inbox."
        )
    if not info["hint"] and info["reason"] in _REPRODUCIBLE and model is not None:
        advice = (
            f"See the same check again with {_command(('sharderd', 'plan'), (model,), ('--devices', '1', *config))}; "
            f"fix or re-export the model. {advice}"
        )
    lines = [
        f"# {info['name']}: failed",
        "",
        f"**What went wrong.** {info['message']}",
        "",
        f"**What to do.** {advice}",
        "",
        f"- reason: `{info['reason']}`",
        f"- job id: `{info['job_id']}`",
        f"- time: {info['time']}",
        f"- exit code: {info['exit_code']}",
    ]
    for key in sorted(k for k in info if k not in core):
        value = str(info[key])
        if "\n" in value or len(value) > 200:
            lines += ["", f"{key} (last 4000 characters):", "", "```", value[-4000:], "```"]
        else:
            lines.append(f"- {key}: {value}")
    reports = [n for n in held if n.startswith("report.")]
    inputs = [text(n) for n in held if not n.startswith("report.")]
    listing = ", ".join(f"`{n}`" for n in inputs) or "nothing of the input"
    lines += [
        "",
        f"This folder, `{text(str(dest))}`, holds the input as it was claimed ({listing}), `error.json` and this file"
        + (
            f", and the reports of the run ({', '.join(f'`{n}`' for n in reports)})."
            if reports
            else "; no report: the job stopped before sharderd wrote one."
        ),
    ]
    lines += [
        "",
        f"To try again, fix the problem, then move the input back into the inbox with "
        f"{_command(('sharderd', 'retry'), (dest.name,), config)}.",
        "",
    ]
    return "\n".join(lines)


def rename_unique(src: Path, parent: Path, name: str) -> Path:
    """Rename ``src`` to ``parent/name``, else ``name-1``, ``name-2``...; never replaces anything."""
    if not name or name in {".", ".."} or "/" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a usable file name")
    for k in range(_MAX_SUFFIX):
        dest = parent / (name if k == 0 else f"{name}-{k}")
        if _rename_noreplace(src, dest):
            fsync_dir(parent)
            if src.parent != parent:
                fsync_dir(src.parent)
            return dest
    raise FileExistsError(
        errno.EEXIST, f"{name} and {_MAX_SUFFIX - 1} suffixed names are taken", str(parent)
    )


def _load_renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc >= 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2: Final = _load_renameat2()
_AT_FDCWD: Final = -100
_RENAME_NOREPLACE: Final = 1
_COLLISION: Final = frozenset({errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR})


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """True when renamed; False when ``dst`` is taken. Other errors raise ``OSError``."""
    if _renameat2 is not None:
        if (
            _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
            == 0
        ):
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.lexists(dst):
        return False
    try:
        src.rename(dst)
    except OSError as exc:
        if exc.errno in _COLLISION:
            return False
        raise
    return True


def _sync_tree(root: Path, file_mode: int, dir_mode: int) -> None:
    """chmod and fsync every file, then every folder bottom-up, so the rename publishes durable data."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for fname in filenames:
            path = Path(dirpath, fname)
            if path.is_symlink():
                continue
            path.chmod(file_mode)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for dname in dirnames:
            sub = Path(dirpath, dname)
            if not sub.is_symlink():
                sub.chmod(dir_mode)
        fsync_dir(Path(dirpath))
    root.chmod(dir_mode)


def _write_synced(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with open(fd, "w", encoding="utf-8") as f:
        os.fchmod(fd, mode)  # exactly ``mode``: the umask may allow more, an older file may differ
        f.write(text)
        f.flush()
        os.fsync(fd)
