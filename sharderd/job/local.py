"""One job in this process, as ``sharderd shard`` and ``sharderd.shard()`` run it (the daemon runs
``shard_job`` under its own pool and folders instead)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sharderd.backends.ipus import IpuPool
from sharderd.backends.pool import AttemptPool
from sharderd.job.prove import Emit
from sharderd.job.run import JobFailed, JobResult, JobSpec, shard_job, write_report

__all__ = ["run_local"]


async def run_local(spec: JobSpec, *, emit: Emit) -> JobResult:
    """Run ``spec`` with its own attempt pool, in a temporary attempts folder removed after.

    Raises:
        JobFailed: the job's error and its partial report; when there is one (the model was
            read), it is already written to ``spec.out_dir`` with its verdict and any attempts.
    """
    pool = AttemptPool(spec.search.parallel, ipus=IpuPool.of_setting(spec.config.poprt.ipus))
    with tempfile.TemporaryDirectory(prefix="sharderd-attempts-") as work:
        try:
            return await shard_job(spec, pool=pool, workdir=Path(work), emit=emit)
        except JobFailed as failed:
            if failed.report is not None:
                write_report(failed.report, spec.out_dir)
            raise
