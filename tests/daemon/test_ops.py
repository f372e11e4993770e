"""The ops surface: ``sharderd status``, the metrics textfile and port, ``sharderd retry`` and ``cancel``.

``status`` and ``cancel`` tests drive a real ``sharderd run`` process (``tests/daemon_helpers.py``):
status checks the daemon's pid and command line; a compile kept running by the fake poprt
(``FAKE_POPRT_COMPILE_SECONDS``) gives them something to see. The metrics and ``retry`` tests run
the service in the test's own event loop (``tests/daemon_served.py``). The commands run in-process
through ``sharderd.cli.main``.
Metrics are checked with a small parser of the text exposition format written here (and
``promtool check metrics`` or prometheus-client's parser when they happen to be installed).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import (
    DaemonProcess,
    chain_model,
    drop,
    marked_processes,
    running,
    save_model,
    staged,
    write_config,
)
from daemon_served import serving

from sharderd import __version__
from sharderd.backends.registry import PROVEN_STATUS
from sharderd.cli import main as cli_main
from sharderd.cli.status import read_status
from sharderd.config import load_config
from sharderd.daemon.metrics import ATTEMPT_BUCKETS_S, AttemptStats, DaemonFigures, render_metrics
from sharderd.isotime import iso_time

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """The systemd unit's UMask=0027, inherited by the daemon started inside the test."""
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def poprt_config(root: Path, **daemon: Any) -> Path:
    return write_config(
        root,
        backend="poprt",
        target="ipu-mk2",
        max_parallel_compiles=2,
        metrics_textfile=root / "metrics" / "sharderd.prom",
        **daemon,
    )


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``sharderd ARGV`` in-process; returns (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def status_file(root: Path) -> dict[str, Any]:
    return json.loads((root / "run" / "status.json").read_text())


def wait_status(
    daemon: DaemonProcess, root: Path, what: str, check: Any, timeout: float = 20.0
) -> dict[str, Any]:
    """Read until ``status.json`` satisfies ``check`` (the daemon rewrites it within 0.5 s of a change)."""
    seen: dict[str, Any] = {}

    def ok() -> bool:
        nonlocal seen
        with contextlib.suppress(FileNotFoundError, ValueError):
            seen = status_file(root)
        return bool(seen) and bool(check(seen))

    daemon.wait_until(ok, timeout, what)
    return seen


def process_groups(pids: list[int]) -> set[int]:
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]))
    return groups


def live_in_groups(groups: set[int]) -> list[int]:
    """Pids (not zombies) whose process group is one of ``groups``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) in groups and fields[0] not in "ZX":
                found.append(int(entry.name))
    return found


# --- a parser of the Prometheus text format (0.0.4), strict about what textfile collectors reject ---

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>.*)\}})? (?P<value>\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_KINDS = {"counter", "gauge", "histogram", "summary", "untyped"}


@dataclass
class Family:
    kind: str
    help: str
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]


def parse_exposition(text: str) -> dict[str, Family]:
    """Families by name; AssertionError on anything a strict reader would refuse."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line!r}"
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert name not in helps, f"second HELP, {where}"
            helps[name] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in _KINDS and name not in families, f"bad or second TYPE, {where}"
            assert re.fullmatch(_NAME, name), where
            families[name] = Family(kind, helps.get(name, ""))
            current = name
        else:
            assert line and not line.startswith("#"), f"unexpected line, {where}"
            match = _SAMPLE.match(line)
            assert match, f"not a sample, {where}"
            name, labels_text = match["name"], match["labels"] or ""
            assert current is not None, f"sample before any TYPE, {where}"
            family = families[current]
            allowed = {current} | (
                {f"{current}_bucket", f"{current}_sum", f"{current}_count"}
                if family.kind == "histogram"
                else set()
            )
            assert name in allowed, f"{name} is outside family {current}, {where}"
            if family.kind == "counter":
                assert name.endswith("_total"), f"a counter's samples end in _total, {where}"
            labels = _LABEL.findall(labels_text)
            assert ",".join(f'{k}="{v}"' for k, v in labels) == labels_text, f"bad labels, {where}"
            key = (name, tuple(sorted(labels)))
            assert key not in family.samples, f"duplicate series, {where}"
            family.samples[key] = float(match["value"])  # float() accepts +Inf, -Inf, NaN
    for name, family in families.items():
        assert family.help, f"{name} has no HELP"
        assert family.samples, f"{name} has no samples"
        if family.kind == "histogram":
            check_histogram(name, family)
    return families


def check_histogram(name: str, family: Family) -> None:
    buckets = sorted(
        (
            (float(dict(labels)["le"]), value)
            for (sample, labels), value in family.samples.items()
            if sample == f"{name}_bucket"
        )
    )
    assert buckets and buckets[-1][0] == math.inf, f"{name} has no +Inf bucket"
    counts = [count for _, count in buckets]
    assert counts == sorted(counts), f"{name}: buckets are not cumulative: {buckets}"
    assert buckets[-1][1] == family.value(f"{name}_count"), f"{name}: +Inf bucket != _count"
    assert family.value(f"{name}_sum") >= 0


def read_metrics(path: Path) -> dict[str, Family]:
    text = path.read_text()
    families = parse_exposition(text)
    promtool = shutil.which("promtool")
    if promtool:
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
    with contextlib.suppress(ImportError):
        from prometheus_client.parser import text_string_to_metric_families

        assert {f.name for f in text_string_to_metric_families(text)} >= {
            "sharderd_jobs",
            "sharderd_up",
        }
    return families


# --- the exposition, without a daemon -------------------------------------------------------------


def figures(stats: AttemptStats, **overrides: Any) -> DaemonFigures:
    values: dict[str, Any] = {
        "version": __version__,
        "up": True,
        "start_time": 1_700_000_000.0,
        "now": 1_700_000_100.5,
        "jobs": {"succeeded": 3, "failed": 1},
        "results": {"verified": 2, "not_compiled": 1},
        "attempts": dict(stats.outcomes),
        "cumulative_buckets": stats.cumulative(),
        "duration_sum_s": stats.seconds,
        "duration_count": stats.count,
        "pending": 4,
        "processing": 2,
        "pool_busy": 2,
        "pool_waiting": 1,
        "pool_slots": 2,
        "last_success": None,
    }
    return DaemonFigures(**{**values, **overrides})


def test_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    """Durations land in the first bucket whose bound they do not exceed; exported counts accumulate."""
    stats = AttemptStats()
    for outcome, seconds in (
        ("ok", 0.5),
        ("ok", 1.0),
        ("oom", 3.0),
        ("timeout", 7200.0),
        ("crashed", 9000.0),
    ):
        stats.observe(outcome, seconds)
    stats.cancelled(2)
    families = parse_exposition(render_metrics(figures(stats)))
    hist = families["sharderd_attempt_duration_seconds"]
    bucket = {
        dict(labels)["le"]: value
        for (name, labels), value in hist.samples.items()
        if name.endswith("_bucket")
    }
    assert bucket["1"] == 2 and bucket["5"] == 3 and bucket["3600"] == 3 and bucket["7200"] == 4
    assert bucket["+Inf"] == 5 and len(bucket) == len(ATTEMPT_BUCKETS_S) + 1
    assert hist.value("sharderd_attempt_duration_seconds_sum") == pytest.approx(16204.5)
    attempts = families["sharderd_attempts_total"]
    assert attempts.value("sharderd_attempts_total", outcome="cancelled") == 2
    assert attempts.value("sharderd_attempts_total", outcome="invalid") == 0  # every outcome from 0
    jobs = families["sharderd_jobs_total"]
    assert jobs.value("sharderd_jobs_total", outcome="succeeded") == 3
    assert jobs.value("sharderd_jobs_total", outcome="cancelled") == 0
    results = families["sharderd_results_total"]
    assert {
        s: results.value("sharderd_results_total", status=s) for s in PROVEN_STATUS.values()
    } == {
        "compiled": 0,  # from 0, so rate() sees the first one
        "verified": 2,
        "not_compiled": 1,
    }
    assert (
        families["sharderd_last_success_timestamp_seconds"].value(
            "sharderd_last_success_timestamp_seconds"
        )
        == 0
    )
    assert (
        families["sharderd_heartbeat_timestamp_seconds"].value(
            "sharderd_heartbeat_timestamp_seconds"
        )
        == 1_700_000_100.5
    )
    info = families["sharderd_build_info"]
    assert [dict(labels)["version"] for _, labels in info.samples] == [__version__]


def test_label_values_are_escaped() -> None:
    """A backslash, quote or newline in a label value is escaped, so the exposition stays parseable."""
    text = render_metrics(figures(AttemptStats(), version='1.0"\\\nx', jobs={'odd"one': 1}))
    families = parse_exposition(text)
    assert 'version="1.0\\"\\\\\\nx"' in text
    assert families["sharderd_jobs_total"].value("sharderd_jobs_total", outcome='odd\\"one') == 1


# --- status ---------------------------------------------------------------------------------------


def test_status_shows_the_compiling_job_in_text_and_json(
    root: Path, capsys: pytest.CaptureFixture[str], strict_umask: None
) -> None:
    """A compiling job shows with its stage and attempts; --json parses; files are 0644 under UMask=0027."""
    config = poprt_config(root)
    (root / "metrics").mkdir()
    with running(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "30"}) as daemon:
        drop(staged(root, "slowpoke"), root / "inbox")
        job_id = daemon.wait_for("attempt.started")[0]["job_id"]
        # The stage and the pool count are written in separate updates: wait for both.
        wait_status(
            daemon,
            root,
            "the job compiling on a busy slot",
            lambda s: (
                s["running"] and s["running"][0]["stage"] == "compiling" and s["pool"]["busy"] == 1
            ),
        )
        code, out, _ = cli(capsys, "status", "--config", str(config))
        assert code == 0, out
        assert out.startswith(f"sharderd {__version__} is up: pid {daemon.pid}, ready since ")
        row = next(line for line in out.splitlines() if job_id in line)
        assert row.split()[1:4] == ["slowpoke", "compiling", "1"]
        assert "queue: 0 pending, 1 processing" in out and "pool: 1 of 2 attempt slots busy" in out
        assert "last 24 h: 0 succeeded, 0 failed, 0 duplicate, 0 cancelled" in out
        assert (
            "succeeded since start, by what proved them: 0 compiled, 0 verified, 0 not_compiled"
            in out
        )
        code, out, _ = cli(capsys, "status", "--config", str(config), "--json")
        report = json.loads(out)
        assert code == 0 and report["up"] is True and report["problem"] is None
        assert 0 <= report["heartbeat_age_s"] < 15
        job = report["daemon"]["running"][0]
        assert (job["job_id"], job["name"], job["stage"], job["attempts"]) == (
            job_id,
            "slowpoke",
            "compiling",
            1,
        )
        assert job["backend"] == "poprt"  # so the stage is "compiling", not "verifying"
        assert report["daemon"]["pool"] == {"busy": 1, "waiting": 0, "max_parallel": 2}
        for path in (root / "run" / "status.json", root / "metrics" / "sharderd.prom"):
            assert path.stat().st_mode & 0o777 == 0o644, path
        assert not [
            p for p in (root / "metrics").iterdir() if p.name != "sharderd.prom"
        ]  # no temp left


def test_status_after_kill_9_is_stale_and_exits_1(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the daemon is SIGKILLed, status says stale (its pid is gone) and exits 1, in text and JSON."""
    config = write_config(root)
    daemon = DaemonProcess(config)
    try:
        daemon.ready()
        wait_status(daemon, root, "state ready", lambda s: s["state"] == "ready")
        assert cli(capsys, "status", "--config", str(config))[0] == 0
        daemon.kill9()
        code, out, _ = cli(capsys, "status", "--config", str(config))
        assert code == 1
        assert out.startswith(f"sharderd is not up: stale: pid {daemon.pid} is gone")
        assert "queue: 0 pending, 0 processing" in out  # the last report is still shown
        code, out, _ = cli(capsys, "status", "--config", str(config), "--json")
        report = json.loads(out)
        assert code == 1 and report["up"] is False and report["problem"].startswith("stale")
        assert report["last_24h_source"] == "journal"
    finally:
        daemon.close()


@contextlib.contextmanager
def stand_in(argv0: str) -> Iterator[int]:
    """A live process whose command line holds ``argv0`` (a hung daemon, or a recycled pid)."""
    code = "import sys; print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, argv0], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert (
            proc.stdout is not None and proc.stdout.readline() == b"up\n"
        )  # exec'd: its cmdline is ours
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def fake_status(root: Path, **fields: Any) -> Path:
    """A config whose runtime folder holds a ``status.json`` with these fields."""
    now = time.time()
    report = {
        "pid": 0,
        "version": __version__,
        "state": "ready",
        "since": iso_time(now - 3600),
        "heartbeat": iso_time(now),
        "heartbeat_interval_s": 15.0,
        "queue": {"pending": 0, "running": 0},
        "running": [],
        "pending_jobs": [],
        "pool": {"busy": 0, "waiting": 0, "max_parallel": 2},
        **fields,
    }
    if isinstance(report["heartbeat"], float):
        report["heartbeat"] = iso_time(report["heartbeat"])
    (root / "run").mkdir(parents=True, exist_ok=True)
    (root / "run" / "status.json").write_text(json.dumps(report))
    return write_config(root)


def test_status_verdicts_without_a_daemon(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No status file, a clean stop, a recycled pid and a live pid with an old heartbeat are all 'not up'."""
    config = write_config(root)
    code, out, _ = cli(capsys, "status", "--config", str(config))
    assert code == 1 and f"not running: there is no {root / 'run' / 'status.json'}" in out
    with stand_in("sharderd-run") as pid:
        fresh = read_status(load_config(fake_status(root, pid=pid)))
        assert fresh.up and fresh.problem is None
        hung = read_status(load_config(fake_status(root, pid=pid, heartbeat=time.time() - 31)))
        assert (
            not hung.up and hung.problem and "stuck" in hung.problem and "31 s ago" in hung.problem
        )
    with stand_in("something-else") as pid:
        recycled = read_status(load_config(fake_status(root, pid=pid)))
        assert not recycled.up and re.fullmatch(
            rf"stale: pid {pid} is gone; last heartbeat \d+ s ago", recycled.problem or ""
        )
    code, out, _ = cli(
        capsys, "status", "--config", str(fake_status(root, pid=os.getpid(), state="stopped"))
    )
    assert code == 1 and "stopped: the daemon" in out


# --- metrics --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_metrics_textfile_parses_and_its_counters_move(root: Path) -> None:
    """The textfile parses strictly; after two jobs the job, attempt and histogram counts have moved."""
    config = poprt_config(root)
    (root / "metrics").mkdir()
    prom = root / "metrics" / "sharderd.prom"
    env = {"FAKE_POPRT_COMPILE_SECONDS": "0"}
    async with serving(config, fake_poprt=True, env=env) as daemon:
        await daemon.wait_until(prom.exists, 10, "the metrics file")
        before = read_metrics(prom)
        assert before["sharderd_up"].value("sharderd_up") == 1
        assert before["sharderd_jobs_total"].value("sharderd_jobs_total", outcome="succeeded") == 0
        assert (
            before["sharderd_attempt_duration_seconds"].value(
                "sharderd_attempt_duration_seconds_count"
            )
            == 0
        )
        assert before["sharderd_pool_slots"].value("sharderd_pool_slots") == 2
        started = time.time()
        for k, name in enumerate(("one", "two")):
            drop(staged(root, name, seed=k), root / "inbox")
        await daemon.wait_for("job.succeeded", count=2, timeout=60)
        ok = len(daemon.events("attempt.finished", result="ok"))

        def moved() -> bool:
            with contextlib.suppress(AssertionError, FileNotFoundError, KeyError):
                jobs = read_metrics(prom)["sharderd_jobs_total"]
                return jobs.value("sharderd_jobs_total", outcome="succeeded") == 2
            return False

        await daemon.wait_until(moved, 10, "the metrics to count both jobs")
        after = read_metrics(prom)
        assert (
            after["sharderd_attempts_total"].value("sharderd_attempts_total", outcome="ok")
            == ok
            >= 2
        )
        hist = after["sharderd_attempt_duration_seconds"]
        assert hist.value("sharderd_attempt_duration_seconds_count") == len(
            daemon.events("attempt.finished")
        )
        assert hist.value("sharderd_attempt_duration_seconds_bucket", le="+Inf") >= 2
        assert (
            after["sharderd_last_success_timestamp_seconds"].value(
                "sharderd_last_success_timestamp_seconds"
            )
            >= started
        )
        assert after["sharderd_queue_depth"].value("sharderd_queue_depth", state="processing") == 0
        assert after["sharderd_pool_busy_slots"].value("sharderd_pool_busy_slots") == 0
    assert read_metrics(prom)["sharderd_up"].value("sharderd_up") == 0  # a clean stop says so


@pytest.mark.anyio
async def test_metrics_port_serves_the_exposition_on_localhost(root: Path) -> None:
    """With prometheus-client installed, ``metrics_port = 0`` serves the same families on 127.0.0.1."""
    pytest.importorskip("prometheus_client")
    async with serving(write_config(root, metrics_port=0)) as daemon:
        url = (await daemon.wait_for("metrics.served"))[0]["url"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        await daemon.wait_status(lambda s: s["state"] == "ready", "state ready")

        def served_up() -> bool:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            return "sharderd_up 1.0" in text and "sharderd_pool_slots 2.0" in text

        await daemon.wait_until(served_up, 10, "the served metrics")
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        assert 'sharderd_jobs_total{outcome="succeeded"} 0.0' in text
        assert 'sharderd_attempt_duration_seconds_bucket{le="7200"} 0.0' in text
        await daemon.stop()  # the server thread stops with the daemon
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=5)


# --- retry ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_retry_brings_a_failed_job_back_and_it_runs_again(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job failed by its sidecar, fixed in failed/ and retried, runs again with the fixed sidecar."""
    config = write_config(root)
    staged(root, "fixme")
    (root / "models" / "fixme.toml").write_text("stages = 3\n")
    async with serving(config) as daemon:
        drop(root / "models" / "fixme.toml", root / "inbox")
        drop(root / "models" / "fixme.onnx", root / "inbox")
        first = (await daemon.wait_for("job.failed", name="fixme"))[0]
        assert first["reason"] == "bad_config"
        failed = root / "state" / "failed" / "fixme"
        assert sorted(p.name for p in failed.iterdir()) == [
            "error.json",
            "error.md",
            "fixme.onnx",
            "fixme.toml",
        ]
        (failed / "fixme.toml").write_text("devices = 3\n")

        code, _, err = cli(capsys, "retry", "nothere", "--config", str(config))
        assert code == 2 and "no failed job named 'nothere'" in err and "Failed jobs: fixme." in err
        (root / "inbox" / "fixme.toml").write_text(
            "devices = 4\n"
        )  # somebody else's sidecar of that name
        code, _, err = cli(capsys, "retry", "fixme", "--config", str(config))
        assert code == 2 and "the inbox already has fixme.toml" in err
        assert (failed / "fixme.onnx").is_file()  # nothing moved
        (root / "inbox" / "fixme.toml").unlink()

        code, out, _ = cli(capsys, "retry", "fixme", "--config", str(config))
        assert code == 0 and f"the failed run was job {first['job_id']} (bad_config)" in out
        assert not failed.exists()  # error.json/md went with the emptied folder
        done = (await daemon.wait_for("job.succeeded", name="fixme"))[0]
        assert done["job_id"] != first["job_id"]
    report = json.loads((root / "outbox" / "fixme" / "report.json").read_text())
    assert len(report["plan"]["stages"]) == 3  # the fixed sidecar came along


# --- cancel ---------------------------------------------------------------------------------------


def test_cancel_kills_the_running_attempt_and_files_the_job_as_cancelled(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sharderd cancel`` kills the compiling attempt's whole group; the job lands in failed/ as cancelled."""
    config = poprt_config(root)
    (root / "metrics").mkdir()
    with running(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "30"}) as daemon:
        drop(staged(root, "victim"), root / "inbox")
        job_id = daemon.wait_for("attempt.started")[0]["job_id"]
        wait_status(
            daemon,
            root,
            "the job compiling",
            lambda s: s["running"] and s["running"][0]["stage"] == "compiling",
        )
        groups = process_groups(marked_processes(daemon.token)) - process_groups([daemon.pid])
        assert groups and live_in_groups(groups)  # the attempt (and the planning worker) run

        code, _, err = cli(
            capsys, "cancel", "20990101T000000000Z-deadbeef", "--config", str(config)
        )
        assert code == 2 and "unknown job id 20990101T000000000Z-deadbeef" in err
        asked = time.monotonic()
        code, out, _ = cli(capsys, "cancel", job_id, "--config", str(config))
        assert code == 0 and f"cancel requested for job {job_id} (victim, running)" in out
        cancelled = daemon.wait_for("job.cancelled", timeout=10)[0]
        assert time.monotonic() - asked < 1.0 + 1.0 + 2.0  # poll interval + kill_grace + slack
        assert cancelled["job_id"] == job_id and cancelled["reason"] == "requested"
        assert live_in_groups(groups) == []  # nothing of the attempt survives
        assert marked_processes(daemon.token) == [daemon.pid]
        assert not daemon.events("job.failed")

        error = json.loads((root / "state" / "failed" / "victim" / "error.json").read_text())
        assert error["reason"] == "cancelled" and error["job_id"] == job_id
        assert (root / "state" / "failed" / "victim" / "victim.onnx").is_file()
        record = json.loads((root / "state" / "journal" / f"{job_id}.json").read_text())
        assert record["state"] == "cancelled"
        assert list((root / "state" / "control").iterdir()) == []  # the request was consumed

        code, out, _ = cli(capsys, "cancel", job_id, "--config", str(config))
        assert code == 1  # already finished
        status = wait_status(
            daemon, root, "the cancel counted", lambda s: s["last_24h"]["cancelled"] == 1
        )
        assert status["running"] == [] and status["pool"]["busy"] == 0
        daemon.wait_until(
            lambda: (
                read_metrics(root / "metrics" / "sharderd.prom")["sharderd_jobs_total"].value(
                    "sharderd_jobs_total", outcome="cancelled"
                )
                == 1
            ),
            5,
            "the metrics to count the cancel",
        )
        metrics = read_metrics(root / "metrics" / "sharderd.prom")
        assert (
            metrics["sharderd_attempts_total"].value("sharderd_attempts_total", outcome="cancelled")
            >= 1
        )


def test_cancel_files_cancel_pending_jobs_by_name_and_by_id(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``<name>.cancel`` and ``sharderd cancel`` of a pending id both file the unclaimed job as cancelled;
    a ``.cancel`` matching nothing is removed and logged."""
    config = write_config(root, settle_seconds=60.0)
    inbox = root / "inbox"
    with running(config) as daemon:
        for name in (
            "early",
            "late",
        ):  # written in place: they settle for a minute, so stay pending
            (inbox / f"{name}.onnx").write_bytes(staged(root, name, seed=len(name)).read_bytes())
        status = wait_status(
            daemon, root, "two pending jobs", lambda s: len(s["pending_jobs"]) == 2
        )
        ids = {job["name"]: job["job_id"] for job in status["pending_jobs"]}
        code, out, _ = cli(capsys, "status", "--config", str(config))
        assert code == 0 and ids["late"] in out and "queue: 2 pending" in out

        (inbox / "early.cancel").write_text("")
        (inbox / "nobody.cancel").write_text("")
        first = daemon.wait_for("job.cancelled", name="early")[0]
        assert first["job_id"] == ids["early"] and first["by"] == "inbox/early.cancel"
        ignored = daemon.wait_for("cancel.ignored")[0]
        assert ignored["name"] == "nobody"
        code, out, _ = cli(capsys, "cancel", ids["late"], "--config", str(config))
        assert code == 0 and "(late, pending)" in out
        daemon.wait_for("job.cancelled", name="late")
        assert sorted(p.name for p in inbox.iterdir()) == []  # models claimed, requests consumed
        for name in ("early", "late"):
            error = json.loads((root / "state" / "failed" / name / "error.json").read_text())
            assert error["reason"] == "cancelled" and error["job_id"] == ids[name]
        assert not daemon.events("plan.started")  # neither ever ran


def test_retry_moves_a_folder_job_back_and_keeps_a_folder_with_unknown_files(root: Path) -> None:
    """A folder job (its sidecar inside) goes back in one rename; a note left in failed/ keeps that folder."""
    from sharderd.daemon.retry import retry_failed

    failed, inbox = root / "failed", root / "inbox"
    inbox.mkdir()
    job = failed / "big"
    save_model(chain_model(1, hidden=32), job / "big" / "net.onnx", external_data=True)
    (job / "big" / "sharderd.toml").write_text("devices = 3\n")
    (job / "error.json").write_text(
        json.dumps({"job_id": "20250101T000000000Z-0000beef", "reason": "timeout"})
    )
    (job / "error.md").write_text("# big: failed\n")
    (job / "notes.txt").write_text("asked the owner\n")
    result = retry_failed(failed, inbox, "big")
    assert (result.name, result.old_job_id, result.reason) == (
        "big",
        "20250101T000000000Z-0000beef",
        "timeout",
    )
    assert result.moved == (inbox / "big",) and result.left == job
    assert sorted(p.name for p in (inbox / "big").iterdir()) == [
        "net.data",
        "net.onnx",
        "sharderd.toml",
    ]
    assert sorted(p.name for p in job.iterdir()) == ["notes.txt"]


def test_a_cancel_file_names_a_job_as_its_inbox_entry_does(tmp_path: Path) -> None:
    """``<name>.cancel`` for a model whose name is not UTF-8 (latin-1 ``été``) asks for the job by
    the name the daemon gives it (``%E9t%E9``), so it matches."""
    from sharderd.daemon.control import ControlWatch

    inbox, control = tmp_path / "inbox", tmp_path / "control"
    inbox.mkdir()
    control.mkdir()
    (inbox / os.fsdecode(b"\xe9t\xe9.onnx.cancel")).write_text("")
    [request] = ControlWatch(inbox, control, full_every_s=60).poll()
    assert request.matches("20250101T000000000Z-00000001", "%E9t%E9")
