"""The bad-input corpus (``tests/corpus.py``) through the real CLI and the real sidecar loader.

Every model case runs ``sharderd plan FILE ARGS`` (and some ``shard --backend none``) as a child
process, from its own folder. The CLI must answer with the expected exit code, one clear
``sharderd: error:`` line (plus at most a hint) naming the culprit, never a traceback, and in
bounded memory. Children are forked from a server that imported the CLI's modules once (onnx alone
costs most of a run) and run ``sharderd.cli`` as ``__main__`` exactly as ``python -m`` does; a few
cases are also run as ``python -m sharderd.cli`` and must answer byte for byte the same.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus import (
    HARD_LINK_SECRET,
    MODEL_CASES,
    SIDECAR_CASES,
    SPARSE_BYTES,
    Case,
    hard_link_outside,
)

from sharderd.config import DaemonConfig
from sharderd.daemon.intake import inspect_entry
from sharderd.daemon.sidecar import load_sidecar
from sharderd.errors import EXIT_BAD_INPUT, EXIT_OK, ConfigError
from sharderd.target import BUILTIN_TARGETS

REPO = Path(__file__).resolve().parents[2]
PARALLEL = max(2, min(8, os.cpu_count() or 2))
MAX_RSS_BYTES = 512 * 1024**2
"""Any case, the 10 GiB sparse model included: the CLI never holds weights in memory."""
ADDRESS_SPACE_LIMIT = 2 * 1024**3
"""Per CLI child (a normal run maps under 200 MB): a runaway allocation fails there, not the host."""
MAX_SPARSE_READ_BYTES = 64 * 1024**2
"""What the sparse case may ``read()`` in all, against 10 GiB of weights."""

_FORK_SERVER = r"""
import json, os, resource, runpy, sys, traceback
import sharderd.engine, sharderd.job.run, sharderd.report.markdown  # what the CLI imports, paid once

def child(job):
    code = 1
    try:
        # A case that blows up must fail on its own, not take the machine down with it.
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
        os.chdir(job["cwd"])
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY | os.O_CREAT),
                                (2, job["stderr"], os.O_WRONLY | os.O_CREAT)):
            os.dup2(os.open(name, flags, 0o600), fd)
        sys.argv = ["sharderd", *job["argv"]]
        try:
            runpy.run_module("sharderd.cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if isinstance(exc.code, int) or exc.code is None:
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()  # what the interpreter prints for an uncaught exception
        sys.stdout.flush()
        sys.stderr.flush()
        with open("/proc/self/io") as f, open(job["io"], "w") as out:
            out.write(f.read())
    finally:
        os._exit(code)

queue = [json.loads(line) for line in sys.stdin]
parallel, LIMIT = int(sys.argv[1]), int(sys.argv[2])
running = {}
while queue or running:
    while queue and len(running) < parallel:
        job = queue.pop(0)
        pid = os.fork()
        if pid == 0:
            child(job)
        running[pid] = job
    pid, status, usage = os.wait4(-1, 0)
    job = running.pop(pid)
    result = {"key": job["key"], "code": os.waitstatus_to_exitcode(status),
              "rss": usage.ru_maxrss * 1024, "cpu": usage.ru_utime + usage.ru_stime}
    os.write(1, (json.dumps(result) + "\n").encode())
"""
"""Runs ``sharderd.cli`` as ``__main__`` (what ``python -m`` does) in one fork per case.

Importing onnx costs most of a CLI run, so a server imports once and forks; each child gets its own
cwd, argv, stdio and address-space limit, and its exit status, peak RSS, CPU time and
``/proc/self/io`` are its own.
``test_fork_server_matches_python_m`` proves it answers byte for byte like ``python -m``.
"""


@dataclass(frozen=True, slots=True)
class Run:
    """One finished CLI process and what it cost."""

    case: Case
    returncode: int
    stdout: str
    stderr: str
    max_rss_bytes: int
    cpu_s: float
    read_bytes: int
    """``rchar``: bytes the process got from ``read()`` and friends, imports included."""


@dataclass(frozen=True, slots=True)
class _Job:
    key: str
    case: Case
    argv: tuple[str, ...]
    cwd: Path


def _jobs(root: Path) -> Iterator[_Job]:
    for name, cli in MODEL_CASES.items():
        folder = root / name
        folder.mkdir()
        case = cli.build(folder)
        yield _Job(name, case, ("plan", str(case.path), *cli.args), folder)
        if cli.shard:
            shard = (
                "shard",
                str(case.path),
                *cli.args,
                "--backend",
                "none",
                "--out",
                str(folder / "out"),
            )
            yield _Job(f"{name}/shard", case, shard, folder)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def run_forked(jobs: list[_Job], logs: Path) -> dict[str, Run]:
    """Run every job's CLI through the fork server, ``PARALLEL`` at a time."""
    files = {
        job.key: {
            kind: str(logs / f"{job.key.replace('/', '.')}.{kind}")
            for kind in ("stdout", "stderr", "io")
        }
        for job in jobs
    }
    requests = "".join(
        json.dumps({"key": job.key, "argv": job.argv, "cwd": str(job.cwd), **files[job.key]}) + "\n"
        for job in jobs
    )
    server = subprocess.run(
        [sys.executable, "-c", _FORK_SERVER, str(PARALLEL), str(ADDRESS_SPACE_LIMIT)],
        input=requests,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert server.returncode == 0, server.stderr
    results = [json.loads(line) for line in server.stdout.splitlines()]
    by_key = {job.key: job for job in jobs}
    runs = {}
    for result in results:
        job, paths = by_key[result["key"]], files[result["key"]]
        counters = dict(line.split(": ") for line in Path(paths["io"]).read_text().splitlines())
        runs[job.key] = Run(
            case=job.case,
            returncode=result["code"],
            stdout=Path(paths["stdout"]).read_text(encoding="utf-8", errors="replace"),
            stderr=Path(paths["stderr"]).read_text(encoding="utf-8", errors="replace"),
            max_rss_bytes=result["rss"],
            cpu_s=result["cpu"],
            read_bytes=int(counters["rchar"]),
        )
    assert set(runs) == set(by_key)
    return runs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> list[_Job]:
    return list(_jobs(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def runs(jobs: list[_Job], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return run_forked(jobs, tmp_path_factory.mktemp("corpus-logs"))


def _cli_params() -> list[object]:
    params = []
    for name, cli in MODEL_CASES.items():
        marks = [pytest.mark.xfail(strict=True, reason=cli.bug)] if cli.bug else []
        params.append(pytest.param(name, marks=marks, id=name))
        if cli.shard:
            params.append(pytest.param(f"{name}/shard", marks=marks, id=f"{name}/shard"))
    return params


def _error_block(stderr: str) -> str:
    """From the CLI's error line to the end (shard prints progress lines before it)."""
    start = stderr.find("sharderd: error: ")
    return "" if start < 0 else stderr[start:]


@pytest.mark.parametrize("key", _cli_params())
def test_cli_answers_each_case_with_its_code_and_a_clear_message(
    runs: dict[str, Run], key: str
) -> None:
    """Exit code as expected; errors are one line naming the culprit (plus a hint), never a traceback."""
    run = runs[key]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.returncode == run.case.exit_code, run.stderr[-2000:]
    if run.case.exit_code == EXIT_OK:
        assert run.case.fragment in run.stdout
        assert "sharderd: error" not in run.stderr
    else:
        block = _error_block(run.stderr)
        assert block, run.stderr
        lines = block.rstrip("\n").split("\n")
        assert len(lines) <= 2, f"message plus hint at most: {block!r}"
        assert run.case.fragment in lines[0]
        assert run.stdout == ""
    assert run.max_rss_bytes < MAX_RSS_BYTES, f"peak RSS {run.max_rss_bytes >> 20} MiB"


def test_sparse_10gb_model_plans_without_reading_its_weights(runs: dict[str, Run]) -> None:
    """10 GiB of sparse external weights plan in little time and memory, and are never read."""
    run = runs["sparse-10gb"]
    data = run.case.path.with_name("big.data")
    st = data.stat()
    assert (
        st.st_size >= SPARSE_BYTES and st.st_blocks * 512 < 1024**2
    )  # really sparse: nothing to read
    assert run.returncode == EXIT_OK, run.stderr[-2000:]
    assert "weights 10.01 GiB (10.01 GiB external)" in run.stdout
    assert run.read_bytes < MAX_SPARSE_READ_BYTES
    assert run.max_rss_bytes < MAX_RSS_BYTES, f"peak RSS {run.max_rss_bytes >> 20} MiB"
    assert run.cpu_s < 10


def test_file_names_with_newlines_and_unicode_are_written_by_shard(runs: dict[str, Run]) -> None:
    """Printable UTF-8 names are kept as they are; a newline is written %0A (``safe_name``), and
    stderr says the files are not named as the model is."""
    for key, written in (("newline-name/shard", "two%0Alines"), ("unicode-name/shard", None)):
        run = runs[key]
        assert run.returncode == EXIT_OK, run.stderr[-2000:]
        given = run.case.path.name.removesuffix(".onnx")
        stem = written or given
        assert (f"the output files are named {stem}.*" in run.stderr) == (stem != given)
        out = run.case.path.parent / "out"
        assert (out / f"{stem}.sharded.onnx").is_file() and (
            out / f"{stem}.sharding.yaml"
        ).is_file()


@pytest.mark.parametrize("name", list(SIDECAR_CASES))
def test_sidecar_case_is_a_config_error_naming_the_sidecar(tmp_path: Path, name: str) -> None:
    """Every bad sidecar is a ConfigError (exit 2) that names the sidecar and the problem."""
    case = SIDECAR_CASES[name](tmp_path)
    with pytest.raises(ConfigError) as info:
        load_sidecar(case.path, DaemonConfig(), known_targets=BUILTIN_TARGETS)
    assert info.value.exit_code == case.exit_code == EXIT_BAD_INPUT
    assert case.fragment in str(info.value)


def test_the_corpus_has_at_least_30_distinct_cases(jobs: list[_Job]) -> None:
    """The issue asks for at least 30 generated cases; each writes its own file."""
    assert len(MODEL_CASES) + len(SIDECAR_CASES) >= 30
    paths = {job.case.path for job in jobs}
    assert len(paths) == len(MODEL_CASES)


def test_daemon_refuses_a_hard_linked_job_file(tmp_path: Path) -> None:
    """A folder job whose data file is hard-linked to a file outside the inbox is a bad job.

    The CLI accepts the same folder (``external-hard-link``): a user reads with their own rights, and
    attempt folders hard-link data on purpose. Only intake, before any link of the daemon's own, can
    refuse it; no path check sees a hard link, ``st_nlink`` does.
    """
    case = hard_link_outside(tmp_path)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    job = case.path.parent.rename(inbox / case.path.parent.name)  # dropped with one rename
    assert (tmp_path / HARD_LINK_SECRET).stat().st_nlink == 2
    candidate = inspect_entry(inbox, job.name)
    assert candidate is not None and stat.S_ISDIR(os.lstat(candidate.path).st_mode)
    assert candidate.problem is not None and "hard link" in candidate.problem


@pytest.mark.parametrize(
    "key",
    ["valid", "unicode-name/shard", "dangling-input", "devices-100000", "external-symlink-out"],
)
def test_fork_server_matches_python_m(jobs: list[_Job], runs: dict[str, Run], key: str) -> None:
    """``python -m sharderd.cli`` gives the same exit code, stdout and stderr as the fork server."""
    job = next(j for j in jobs if j.key == key)
    out = job.cwd / "out"
    if out.exists():
        shutil.rmtree(out)  # shard writes it again
    proc = subprocess.run(
        [sys.executable, "-m", "sharderd.cli", *job.argv],
        cwd=job.cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    run = runs[key]
    assert (proc.returncode, proc.stdout, proc.stderr) == (run.returncode, run.stdout, run.stderr)
