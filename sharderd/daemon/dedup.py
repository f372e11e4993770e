"""The same content twice is done once: a job's content key, and one job per key at a time.

The key is a sha256 over the input's bytes and every option that shapes the result (not its name,
priority or limits). While one job computes a key's result, a second job with the same key waits
(``exclusive``), then finds the first one's result in the journal's index and is a duplicate: its
``outbox/<name>/`` holds reports that point at the original (``publish_pointer``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.lowlevel

from sharderd.config import Config
from sharderd.daemon.intake import ClaimedJob
from sharderd.daemon.outbox import TMP_PREFIX, find_published, publish, tmp_dir_for
from sharderd.daemon.sidecar import JobOptions
from sharderd.filenames import raw_bytes
from sharderd.report.duplicate import duplicate_report, write_duplicate

__all__ = ["content_key", "effective_options", "exclusive", "publish_pointer"]

_CHUNK: Final = 1 << 20


def effective_options(config: Config, options: JobOptions) -> dict[str, Any]:
    """Every option that changes the result; priority and limits do not."""
    return {
        "devices": options.devices,
        **({"auto_devices": True} if options.auto_devices else {}),
        "target": asdict(config.target(options.target)),
        "backend": options.backend,
        "optimal_perf": options.optimal_perf,
        "plan": _plain(asdict(options.plan_config(config.plan))),
        "poprt": asdict(config.poprt),
        "onnxruntime": asdict(config.onnxruntime),
        "fallbacks": [config.search.amp_fallbacks, config.search.speculative_margins],
    }


async def content_key(job: ClaimedJob, options: Mapping[str, Any]) -> str:
    """sha256 over the job's input bytes and the options that shape its result, not its name.

    Read in 1 MiB chunks with a checkpoint between them: hashing a huge model must not stall the
    event loop (the watchdog, other jobs).
    """
    digest = hashlib.sha256(b"sharderd-content/1\n")
    digest.update(json.dumps(options, sort_keys=True, default=str).encode() + b"\n")
    for rel, path in _content_files(job):
        digest.update(raw_bytes(rel) + b"\0")  # a name's own bytes, UTF-8 or not
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                await anyio.lowlevel.checkpoint()
        digest.update(b"\0")
    return digest.hexdigest()


@contextlib.asynccontextmanager
async def exclusive(
    inflight: dict[str, anyio.Event], key: str, *, on_wait: Callable[[], None]
) -> AsyncIterator[None]:
    """Hold ``key`` for the body; a holder already there is waited for (``on_wait`` first)."""
    while (busy := inflight.get(key)) is not None:
        on_wait()
        await busy.wait()
    done = inflight[key] = anyio.Event()
    try:
        yield
    finally:
        del inflight[key]
        done.set()


def publish_pointer(
    outbox: Path,
    job: ClaimedJob,
    key: str,
    original_job_id: str,
    original: Path,
    *,
    file_mode: int,
    dir_mode: int,
) -> Path:
    """``outbox/<name>/`` of a duplicate: its reports and ``duplicate.json`` point at ``original``."""
    found = find_published(outbox, job.name, job.job_id)
    if found is not None:  # published before a crash
        return found
    shutil.rmtree(outbox / f"{TMP_PREFIX}{job.job_id}", ignore_errors=True)
    tmp = tmp_dir_for(outbox, job.job_id)
    report = duplicate_report(
        name=job.name,
        job_id=job.job_id,
        sha256=key,
        original_job_id=original_job_id,
        original_result=original,
    )
    write_duplicate(report, tmp)
    return publish(tmp, outbox, job.name, file_mode=file_mode, dir_mode=dir_mode)


def _content_files(job: ClaimedJob) -> Iterator[tuple[str, Path]]:
    """The model (file job), or every regular file in the folder but its sidecar (folder job)."""
    if job.kind == "file":
        assert job.model is not None
        yield "model.onnx", job.model
        return
    for dirpath, dirnames, filenames in os.walk(job.entry):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path == job.sidecar or not stat.S_ISREG(path.lstat().st_mode):
                continue
            yield path.relative_to(job.entry).as_posix(), path


def _plain(value: Any) -> Any:
    """JSON-ready: mappings as dicts, tuples as lists (for the dedup key and the report)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
