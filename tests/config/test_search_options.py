"""A job's search options are resolved once: a flag or sidecar value, else [daemon] (daemon jobs),
else [search]."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharderd.cli import main
from sharderd.config import Config, DaemonConfig, SearchConfig, search_options


def _config() -> Config:
    search = SearchConfig(
        backend="onnxruntime",
        optimal_perf=True,
        max_attempts=3,
        parallel=4,
        attempt_timeout=50.0,
        kill_grace=1.0,
    )
    daemon = DaemonConfig(
        backend="none",
        max_attempts=6,
        max_parallel_compiles=7,
        attempt_timeout=80.0,
        kill_grace=2.0,
    )
    return Config(search=search, daemon=daemon)


def test_search_section_for_the_cli_daemon_section_for_daemon_jobs() -> None:
    cli = search_options(_config())
    assert (cli.backend, cli.optimal_perf, cli.max_attempts) == ("onnxruntime", True, 3)
    assert (cli.parallel, cli.attempt_timeout, cli.kill_grace) == (4, 50.0, 1.0)
    job = search_options(_config(), daemon=True)
    assert (job.backend, job.optimal_perf, job.max_attempts) == ("none", True, 6)
    assert (job.parallel, job.attempt_timeout, job.kill_grace) == (7, 80.0, 2.0)


def test_given_values_win_and_none_means_not_given() -> None:
    given = search_options(
        _config(),
        daemon=True,
        backend="poprt",
        optimal_perf=False,
        max_attempts=1,
        parallel=None,
        attempt_timeout=9.0,
        kill_grace=0.0,
    )
    assert (given.backend, given.optimal_perf, given.max_attempts) == ("poprt", False, 1)
    assert (given.parallel, given.attempt_timeout, given.kill_grace) == (7, 9.0, 0.0)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--parallel", "--parallel must be >= 1, got 0"),
        ("--max-attempts", "--max-attempts must be >= 1, got 0"),
        ("--attempt-timeout", "--attempt-timeout must be > 0, got 0.0"),
    ],
)
def test_shard_refuses_a_zero_limit_as_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    assert main(["shard", str(tmp_path / "m.onnx"), "--devices", "2", flag, "0"]) == 2
    assert message in capsys.readouterr().err
