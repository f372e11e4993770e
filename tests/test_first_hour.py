"""Issue 14, "a new user's first hour": every hint sharderd prints works as written, every claim holds.

Each test runs the CLI or the daemon as a real process, on the inputs a new user meets: the broken
models of ``tests/corpus.py``, the systemd README's rename recipe, a duplicate drop, a truncated
copy, an ``ai.onnx.ml`` model, and the README's own sentences.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from corpus import MODEL_CASES
from daemon_helpers import chain_model, running, save_model, ts, write_config

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

REPO = Path(__file__).resolve().parent.parent


def sharderd(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sharderd.cli", *map(str, args)],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


# --- 2. the rename-in fast path -----------------------------------------------------------------

SETTLE = 5.0


def test_twenty_renames_of_the_systemd_recipe_are_each_claimed_by_the_rename_not_the_settle_window(
    tmp_path: Path,
) -> None:
    """``cp model inbox/.x.onnx.part && mv inbox/.x.onnx.part inbox/x.onnx`` (the rename in the same
    clock tick as the last write, so ctime == mtime), 20 times with the default settle_seconds: each
    is detected as moved in and claimed well inside the 5 s settle window. The < 1 s pickup itself
    is measured by bench/daemon_throughput.py (BENCHMARKS.md), not timed here: a loaded CI host
    must not fail a fast path that worked."""
    model = save_model(chain_model(7), tmp_path / "models" / "src.onnx")
    inbox = tmp_path / "inbox"
    with running(write_config(tmp_path, settle_seconds=SETTLE, rescan_interval=30.0)) as daemon:
        for k in range(20):
            name = f"r{k:02d}"
            part = inbox / f".{name}.onnx.part"
            subprocess.run(["cp", str(model), str(part)], check=True)
            subprocess.run(["mv", str(part), str(inbox / f"{name}.onnx")], check=True)
            moved = (inbox / f"{name}.onnx").stat().st_ctime
            claimed = daemon.wait_for("job.claimed", name=name, timeout=10)[0]
            assert ts(claimed) - moved < SETTLE / 2, (name, ts(claimed) - moved)
            daemon.wait_for("job.duplicate" if k else "job.succeeded", name=name, timeout=30)
        detected = daemon.events("job.detected")
        assert len(detected) == 20 and all(line["moved_in"] for line in detected), detected


def test_a_file_written_in_place_still_waits_for_settle_seconds(tmp_path: Path) -> None:
    """The fast path is the rename's: a model written straight into the inbox is not moved in."""
    data = save_model(chain_model(8), tmp_path / "models" / "src.onnx").read_bytes()
    with running(write_config(tmp_path, settle_seconds=1.5, rescan_interval=30.0)) as daemon:
        target = tmp_path / "inbox" / "w.onnx"
        target.write_bytes(data)
        written = target.stat().st_mtime
        claimed = daemon.wait_for("job.claimed", name="w", timeout=20)[0]
        assert ts(claimed) - written >= 1.5 - 0.05
        assert daemon.events("job.detected", name="w")[0]["moved_in"] is False


# --- 1. every hint is a command that works as written ---------------------------------------------

HINT_COMMAND = re.compile(r"`((?:python3?|sharderd) [^`]+)`")
"""A backticked span that is a command: what a user would paste into a shell."""


def hint_commands(text: str) -> list[str]:
    return HINT_COMMAND.findall(text)


def check_diagnostic(command: str, cwd: Path) -> None:
    """A hint that diagnoses a broken input must say so: exit non-zero, no Python warning instead."""
    assert "-m onnx.checker" not in command, command
    done = subprocess.run(
        command, shell=True, cwd=cwd, text=True, capture_output=True, timeout=120, check=False
    )
    assert done.returncode != 0, (command, done.stdout, done.stderr)
    assert "RuntimeWarning" not in done.stderr and (done.stdout + done.stderr).strip(), (
        command,
        done.stderr,
    )


@pytest.mark.parametrize("case", [n for n, c in MODEL_CASES.items() if c.bug is None])
def test_every_hint_the_cli_prints_for_a_broken_model_runs_and_shows_the_problem(
    case: str, tmp_path: Path
) -> None:
    """Each command in ``sharderd plan``'s error for a corpus model, run as printed, reports the problem."""
    built = MODEL_CASES[case].build(tmp_path)
    if built.exit_code == 0:
        pytest.skip("a valid input: no hint")
    args = MODEL_CASES[case].args or ("--devices", "2")
    done = sharderd("plan", built.path, *args, cwd=tmp_path)
    assert done.returncode == built.exit_code, done.stderr
    for command in hint_commands(done.stderr):
        check_diagnostic(command, tmp_path)


def test_a_parse_failure_hint_is_the_checker_and_it_fails_on_the_file(tmp_path: Path) -> None:
    """The corpus' truncated and garbage models get a runnable checker command (was ``python -m onnx.checker``,
    which exits 0 on any file)."""
    for case in ("truncated-50", "random-bytes", "graph-not-model"):
        built = MODEL_CASES[case].build(tmp_path)
        done = sharderd("plan", built.path, "--devices", "2", cwd=tmp_path)
        [command] = hint_commands(done.stderr)
        assert "onnx.checker.check_model" in command
        check_diagnostic(command, tmp_path)


# --- 1, 5, 6, 7, 8 through the daemon ---------------------------------------------------------------


def test_failed_and_duplicate_jobs_tell_the_truth(tmp_path: Path) -> None:
    """One daemon, the inputs a new user drops:

    - a broken model's ``error.md`` gives commands that work as written (the diagnosis fails on the
      file, ``sharderd retry`` moves it back) and names where the input is now, ``failed/<name>``
      (a suffixed name when ``failed/<name>`` was taken), never ``processing/<job_id>/``;
    - a truncated copy "looks incomplete"; an ``ai.onnx.ml`` model is told what sharderd supports;
    - ``error.md`` lists what the folder holds, and that holds: no report when no plan existed;
    - a duplicate gets ``outbox/<name>/`` pointing at the first result, and its report says so.
    """
    cases = tmp_path / "cases"
    cases.mkdir()
    broken = {
        case: MODEL_CASES[case].build(cases).path
        for case in ("truncated-50", "random-bytes", "ml-only", "unnamed-nodes")
    }
    first = save_model(chain_model(11), tmp_path / "models" / "first.onnx")
    second = tmp_path / "models" / "second.onnx"
    second.write_bytes(first.read_bytes())
    (tmp_path / "state" / "failed" / "random").mkdir(parents=True)  # taken: the job gets random-1
    config = write_config(tmp_path)
    inbox = tmp_path / "inbox"
    with running(config) as daemon:
        names = {}
        for case, path in broken.items():
            names[case] = path.stem
            path.rename(inbox / path.name)
        daemon.wait_for("job.failed", count=len(broken), timeout=60)
        first.rename(inbox / first.name)
        daemon.wait_for("job.succeeded", name="first", timeout=30)
        second.rename(inbox / second.name)
        duplicate = daemon.wait_for("job.duplicate", name="second", timeout=30)[0]
    failed = tmp_path / "state" / "failed"
    folders = {
        names[c]: failed / (names[c] + ("-1" if names[c] == "random" else "")) for c in broken
    }
    messages = {
        name: json.loads((folder / "error.json").read_text())["message"]
        for name, folder in folders.items()
    }
    for name, folder in folders.items():
        md = (folder / "error.md").read_text()
        assert "processing" not in md and "processing" not in (folder / "error.json").read_text(), (
            md
        )
        assert str(folder) in md
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f"{name}.onnx", "error.json", "error.md"]
        )
        assert "no report: the job stopped before sharderd wrote one" in md
        commands = hint_commands(md)
        retry = [c for c in commands if c.startswith("sharderd retry")]
        assert retry == [f"sharderd retry {folder.name} --config {config}"], commands
        for command in commands:
            if command not in retry:
                check_diagnostic(command, tmp_path)
        assert (
            subprocess.run(retry[0], shell=True, check=False, capture_output=True).returncode == 0
        )
        assert (inbox / f"{name}.onnx").is_file()
    assert "looks incomplete" in messages[names["truncated-50"]]
    assert (
        "sharderd splits neural-network graphs of default-domain (ai.onnx) ops"
        in messages[names["ml-only"]]
    )
    # 5: the duplicate's outbox entry and report
    pointer = tmp_path / "outbox" / "second"
    assert (
        json.loads((pointer / "duplicate.json").read_text())["duplicate_of"]["result"]
        == duplicate["result"]
    )
    for folder in (pointer, tmp_path / "state" / "done" / "second"):
        report_md = (folder / "report.md").read_text()
        assert report_md.startswith("# sharderd report: second: duplicate")
        assert "first.onnx" not in report_md.splitlines()[0] and duplicate["result"] in report_md
        assert json.loads((folder / "report.json").read_text())["status"] == "duplicate"
    assert 'href="../first/report.html"' in (pointer / "report.html").read_text()


# --- 3, 4: the report says what was measured where, and every term of a stage's time ------------------


@pytest.fixture(scope="module")
def small_transformer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    done = sharderd(
        "example-model",
        "transformer",
        "--out",
        folder / "t.onnx",
        "--set",
        "layers=2",
        "--set",
        "hidden=32",
        "--set",
        "seq=8",
        "--set",
        "vocab=50",
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr
    return folder / "t.onnx"


def shard_report(model: Path, out: Path, *args: str) -> tuple[dict[str, Any], str, str, str]:
    """``report.json``, ``.md``, ``.html`` and what the command printed (progress lines included)."""
    pytest.importorskip("onnxruntime")
    done = sharderd(
        "shard", model, "--devices", "2", "--backend", "onnxruntime", "--out", out, *args
    )
    assert done.returncode == 0, done.stderr
    return (
        json.loads((out / "report.json").read_text()),
        (out / "report.md").read_text(),
        (out / "report.html").read_text(),
        done.stdout + done.stderr,
    )


def test_ipu_predictions_and_cpu_measurements_compare_as_shares_not_seconds(
    small_transformer: Path, tmp_path: Path
) -> None:
    """Default target ipu-mk2, measured by onnxruntime on the CPU: the report says where each number
    comes from, compares per-stage shares (not µs against ms), and claims no compile and no amp."""
    report, md, html, printed = shard_report(small_transformer, tmp_path / "out")
    assert report["target"]["name"] == "ipu-mk2" and report["backend"] == "onnxruntime"
    assert "[attempt.started]" in printed and "amp=" not in printed
    assert (
        "share per stage" in md and "Different devices, so the absolute times do not compare" in md
    )
    assert "measured with onnxruntime (CPUExecutionProvider) on the host that ran sharderd" in md
    assert "a different device: the two numbers do not compare" in md
    assert "status: **verified**" in md and "nothing was compiled" in md
    assert "## Attempts (onnxruntime runs: nothing was compiled)" in md
    assert "Compile attempts" not in md and "Compile attempts" not in html
    assert 'data-compare="shares"' in html and "data-share=" in html
    assert re.search(r'data-status="verified">verified<', html)
    measured = re.findall(r'class="bar-measured" data-seconds="[^"]+" data-share="([^"]+)"', html)
    assert measured and abs(sum(map(float, measured)) - 1.0) < 1e-9
    assert "different device from the prediction" in html
    attempts = html[html.index('<table class="attempts">') :]
    amp_cells = re.findall(r"</code></td><td>([^<]*)</td>", attempts[: attempts.index("</table>")])
    assert amp_cells and all(cell == "" for cell in amp_cells), (
        amp_cells
    )  # no "amp 0" for onnxruntime


def test_a_cpu_target_measured_on_the_cpu_compares_absolute_times(
    small_transformer: Path, tmp_path: Path
) -> None:
    """Same kind of device (target cpu, CPUExecutionProvider): seconds beside seconds."""
    _, md, html, _ = shard_report(small_transformer, tmp_path / "out", "--target", "cpu")
    assert "| measured |" in md and "share per stage" not in md
    assert 'data-compare="absolute"' in html and "data-share=" not in html


def test_every_term_of_a_stage_time_is_reported_and_they_sum_to_it(
    small_transformer: Path, tmp_path: Path
) -> None:
    """compute + per-node overhead + host I/O + comm in + comm out = the stage's time, in all three files;
    the last stage's logits going to the host show as host I/O (they were hidden in "time" before)."""
    report, md, html, _ = shard_report(small_transformer, tmp_path / "out")
    terms = ("flops_s", "overhead_s", "host_s", "comm_in_s", "comm_out_s")
    for stage in report["plan"]["stages"]:
        assert sum(stage[t] for t in terms) == pytest.approx(stage["time_s"], rel=1e-9, abs=1e-15)
        assert all(stage[t] >= 0 for t in terms)
    assert report["plan"]["stages"][-1]["host_s"] > 0
    for label in ("compute", "per-node overhead", "host I/O", "comm in", "comm out"):
        assert f"| {label} |" in md or f" {label} |" in md
        assert f"<th>{label}</th>" in html


# --- 9. the small ones ----------------------------------------------------------------------------------


def test_an_option_plan_does_not_take_gets_plans_usage_not_the_roots(tmp_path: Path) -> None:
    """``sharderd plan M --devices 2 --backend none``: plan's usage and plan's name in the error."""
    done = sharderd("plan", tmp_path / "m.onnx", "--devices", "2", "--backend", "none")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: sharderd plan ")
    assert "sharderd plan: error: unrecognized arguments: --backend none" in done.stderr


def test_top_level_help_is_for_users_not_the_modules_docstring() -> None:
    done = sharderd("--help")
    assert done.returncode == 0
    assert "the command line. Thin" not in done.stdout and "``" not in done.stdout
    assert "pipeline stages" in done.stdout and "Exit codes" in done.stdout


@pytest.mark.skipif(
    Path("/etc/sharderd/sharderd.toml").exists(), reason="this host has the unit's config"
)
def test_status_without_config_suggests_the_file_and_that_command_reads_it(tmp_path: Path) -> None:
    """No --config, no /etc/sharderd/sharderd.toml: say so, and suggest the sharderd.toml of this folder;
    the suggested command, run as written, reads that daemon's folders."""
    config = write_config(tmp_path)
    done = sharderd("status", cwd=tmp_path)
    assert done.returncode == 1
    assert "No --config was given and /etc/sharderd/sharderd.toml does not exist" in done.stdout
    [command] = hint_commands(done.stdout)
    assert command == f"sharderd status --config {config.name}"
    suggested = subprocess.run(
        command, shell=True, cwd=tmp_path, text=True, capture_output=True, check=False
    )
    assert str(tmp_path / "run" / "status.json") in suggested.stdout
    assert (
        "from the journal" not in done.stdout
    )  # no journal under the default folders: no counts claimed


README = (REPO / "README.md").read_text(encoding="utf-8")
DAEMON_DOC = (REPO / "docs" / "daemon.md").read_text(encoding="utf-8")


def _section(title: str, text: str = README) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end]


def test_readme_daemon_section_says_it_refuses_root_and_how_to_allow_it() -> None:
    daemon = _section("## The daemon and its inbox", DAEMON_DOC)
    assert "refuses to run as root" in daemon and "allow_root = true" in daemon


def test_readme_output_listings_hold_what_runs_write(
    small_transformer: Path, tmp_path: Path
) -> None:
    """The CLI listing names every file ``shard`` writes (report.html included); the daemon's names
    ``.sharderd-job``, which every published outbox folder holds."""
    listing = _section("## What a run gives you")
    shard_report(small_transformer, tmp_path / "out")
    for path in (tmp_path / "out").iterdir():
        shown = f"example-transformer.{path.name[2:]}" if path.name.startswith("t.") else path.name
        assert shown in listing, path.name
    results = _section("## The daemon and its inbox", DAEMON_DOC)
    assert ".sharderd-job" in results and "report.html" in results


def test_readme_says_above_the_test_command_how_many_report_tests_skip_without_chromium() -> None:
    """The one line above the test command: the number it gives is the report tests' number."""
    block = README[README.index("```bash\n") : README.index("```", README.index("```bash\n") + 7)]
    lines = block.splitlines()
    test_command = lines.index("python3 -m pip install -e '.[test]' && python3 -m pytest")
    note = lines[test_command - 1]
    assert note.startswith("#") and "chromium" in note
    count = int(re.search(r"skips the (\d+) report", note).group(1))  # type: ignore[union-attr]
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n0",  # list in this process, not through pytest-xdist's workers
            "tests/report/test_report_html.py",
        ],
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert sum(1 for ln in collected.stdout.splitlines() if "::" in ln) == count


def test_readme_says_what_a_failed_folder_holds() -> None:
    """Not "report.html/json/md" for every failed job: only when the model loaded."""
    daemon = _section("## The daemon and its inbox", DAEMON_DOC)
    assert "when the model loaded" in daemon
    report_doc = (REPO / "docs" / "report.md").read_text(encoding="utf-8")
    assert "(and every daemon job in `done/` or `failed/`) holds `report.html`" not in report_doc


def test_every_broken_corpus_model_dropped_into_the_daemon_gets_an_error_md_whose_commands_work(
    tmp_path: Path,
) -> None:
    """The whole corpus through one daemon (each case that fails with the default options and is a
    file or folder a user could drop): every error.md names paths under ``failed/``, never
    ``processing/``, and each command in it runs as written (diagnoses fail on the input)."""
    dropped: dict[str, Path] = {}
    for case, cli in MODEL_CASES.items():
        if cli.bug is not None or cli.args != ("--devices", "2"):
            continue
        folder = tmp_path / "cases" / case
        folder.mkdir(parents=True)
        built = cli.build(folder)
        entry = built.path if built.path.parent == folder else built.path.parent
        if built.exit_code == 0 or not os.path.lexists(entry) or "\n" in entry.name:
            continue
        if entry.is_dir() and not entry.is_symlink() and not any(entry.glob("*.onnx")):
            continue  # a folder named like a model, holding none: not a job, rightly left alone
        dropped[case] = entry
    inbox = tmp_path / "inbox"
    with running(write_config(tmp_path, rescan_interval=30.0)) as daemon:
        for entry in dropped.values():
            entry.rename(inbox / entry.name)
        daemon.wait_until(
            lambda: (
                not any(inbox.iterdir()) and not any((tmp_path / "state" / "processing").iterdir())
            ),
            120,
            "every dropped case to be filed",
        )
        failed_lines = daemon.events("job.failed")
    assert sorted(line["name"] for line in failed_lines) == sorted(
        e.name.removesuffix(".onnx") for e in dropped.values()
    )
    assert len(failed_lines) >= 25
    for line in failed_lines:
        folder = Path(line["failed"])
        md = (folder / "error.md").read_text()
        assert "/processing/" not in md, md
        commands = hint_commands(md)
        assert any(c.startswith("sharderd retry ") for c in commands), md
        for command in commands:
            if not command.startswith("sharderd retry "):
                check_diagnostic(command, tmp_path)


def test_readme_main_job_runs_as_written_from_a_fresh_folder(tmp_path: Path) -> None:
    """README's first command after its install step, in an empty folder with relative paths (as
    a new user types it): the sharded model is written and verified against the user's own file.
    (The attempt runs in its own folder: a relative reference path once made this exit 1.)"""
    pytest.importorskip("onnxruntime")
    block = README[README.index("```bash\n") + 8 :].splitlines()
    first = block[0]
    assert first.startswith("python3 -m pip install ") and " && sharderd " in first
    job = first.split(" && ", 1)[1].replace("sharderd ", f"{sys.executable} -m sharderd.cli ")
    done = subprocess.run(
        job, shell=True, cwd=tmp_path, text=True, capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "example-transformer.sharded" / "report.json").read_text())
    assert report["status"] == "verified"  # onnxruntime ran it: nothing compiled
    assert report["verification"]["passed"] is True, report["verification"]
