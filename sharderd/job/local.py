"""One job in this process, as ``sharderd shard`` and ``sharderd.shard()`` run it (the daemon runs
``shard_job`` under its own pool and folders instead)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sharderd.backends.ipus import IpuPool
from sharderd.backends.pool import AttemptPool
from sharderd.errors import ModelInvalidError
from sharderd.job.prove import Emit
from sharderd.job.run import REPORT_FILES, JobFailed, JobResult, JobSpec, shard_job, write_report

__all__ = ["check_model_file", "occupied", "run_local"]


def occupied(out_dir: Path, stem: str) -> str | None:
    """Why writing the results into ``out_dir`` would overwrite an earlier result, or None when it
    would not: the folder is missing, or holds none of the files every result has (a model's own
    folder is a fine ``out``). The caller refuses, naming its own way to insist."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        return f"output folder {out_dir} exists and is not a folder"
    names = (f"{stem}.sharded.onnx", f"{stem}.sharding.yaml", *REPORT_FILES)
    found = [name for name in names if (out_dir / name).exists()]
    if found:
        return f"output folder {out_dir} already holds a result ({', '.join(found)}): writing would replace it"
    return None


def check_model_file(path: Path) -> None:
    """A model that cannot be opened is said at once, before any progress event.

    Raises:
        ModelInvalidError: it is missing, a folder, or unreadable.
    """
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None


async def run_local(spec: JobSpec, *, emit: Emit) -> JobResult:
    """Run ``spec`` with its own attempt pool, in a temporary attempts folder removed after.

    Raises:
        JobFailed: the job's error and its partial report; when there is one (the model was
            read), it is already written to ``spec.out_dir`` with its verdict and any attempts.
    """
    try:
        check_model_file(spec.model)
    except ModelInvalidError as err:
        raise JobFailed(err, None) from None
    pool = AttemptPool(spec.search.parallel, ipus=IpuPool.of_setting(spec.config.poprt.ipus))
    with tempfile.TemporaryDirectory(prefix="sharderd-attempts-") as work:
        try:
            return await shard_job(spec, pool=pool, workdir=Path(work), emit=emit)
        except JobFailed as failed:
            if failed.report is not None:
                write_report(failed.report, spec.out_dir)
            raise
