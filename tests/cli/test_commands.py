"""The command line's manners (issue 38): no abbreviations, help from the registries, errors said
before any work starts, nothing overwritten silently, a closed pipe ends a command quietly."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sharderd import examples
from sharderd.cli import main as cli_main
from sharderd.cli.parser import build_parser
from sharderd.errors import EXIT_BAD_INPUT, EXIT_OK

REPO = Path(__file__).resolve().parents[2]
Run = Callable[..., subprocess.CompletedProcess[str]]


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_no_parser_takes_abbreviations() -> None:
    assert build_parser().allow_abbrev is False
    assert {name: p.allow_abbrev for name, p in _commands().items()} == dict.fromkeys(
        _commands(), False
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["plan", "m.onnx", "--device", "4"], "required: --devices"),  # not taken as --devices
        (["plan", "m.onnx", "-n", "2", "--batch", "4"], "unrecognized arguments: --batch 4"),
        (["shard", "m.onnx", "-n", "2", "--over"], "unrecognized arguments: --over"),
    ],
)
def test_an_abbreviated_flag_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    assert exit_.value.code == EXIT_BAD_INPUT
    assert said in capsys.readouterr().err


def test_the_full_flag_still_works(model_path: Callable[..., Path]) -> None:
    """The control case: the spelled-out flags parse (and the plan runs)."""
    model = model_path("chain")
    assert (
        cli_main(["plan", str(model), "--devices", "2", "--batch-size", "1", "--json"]) == EXIT_OK
    )


def test_example_model_help_lists_every_builder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["example-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"one of {', '.join(examples.EXAMPLES)} (default transformer)" in text
    assert len(examples.EXAMPLES) >= 8


def test_a_missing_model_is_said_before_any_event(tmp_path: Path, run_cli: Run) -> None:
    proc = run_cli("shard", tmp_path / "missing.onnx", "--devices", "2", cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr == (
        f"sharderd: error: cannot read model {tmp_path / 'missing.onnx'}: No such file or directory\n"
    )
    assert not (tmp_path / "missing.sharded").exists()


def test_a_folder_given_as_the_model_is_said_before_any_event(tmp_path: Path, run_cli: Run) -> None:
    (tmp_path / "folder.onnx").mkdir()
    proc = run_cli("shard", tmp_path / "folder.onnx", "--devices", "2", cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.startswith("sharderd: error: cannot read model") and "[" not in proc.stderr


def test_shard_refuses_a_folder_that_holds_a_result_and_overwrite_replaces_it(
    model_path: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_path("chain")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # not a result: written beside it
    args = ["shard", str(model), "-n", "2", "-b", "none", "-q", "-o", str(out)]
    assert cli_main(args) == EXIT_OK
    first = json.loads((out / "report.json").read_text())
    capsys.readouterr()

    assert cli_main(args) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"output folder {out} already holds a result (chain.sharded.onnx, " in err
    assert "add --overwrite to replace it" in err
    assert json.loads((out / "report.json").read_text()) == first  # untouched

    assert cli_main([*args, "--overwrite"]) == EXIT_OK
    assert json.loads((out / "report.json").read_text())["created"] >= first["created"]
    assert (out / "notes.txt").read_text() == "mine"  # files of other names stay


@pytest.mark.parametrize("left", ["report.json", "chain.sharding.yaml", "chain.sharded.onnx"])
def test_any_file_of_a_result_counts_as_one(
    model_path: Callable[..., Path], tmp_path: Path, left: str
) -> None:
    """A failed run leaves its reports only; a half-copied result may miss some: each is refused."""
    out = tmp_path / "out"
    out.mkdir()
    (out / left).write_text("earlier")
    args = ["shard", str(model_path("chain")), "-n", "2", "-b", "none", "-q", "--out", str(out)]
    assert cli_main(args) == EXIT_BAD_INPUT
    assert (out / left).read_text() == "earlier"


def test_shard_refuses_a_file_where_the_folder_goes(
    model_path: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.write_text("not a folder")
    args = ["shard", str(model_path("chain")), "-n", "2", "-b", "none", "-q", "--out", str(out)]
    assert cli_main(args) == EXIT_BAD_INPUT
    assert "exists and is not a folder" in capsys.readouterr().err


def _closed_stdout(*args: str, cwd: Path) -> tuple[int, str]:
    """Run the CLI with the reading end of its stdout closed before it writes (``| head`` that
    already quit)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharderd.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize("command", [["status", "--json"], ["status"], ["check-config"]])
def test_a_closed_pipe_ends_a_command_quietly(tmp_path: Path, command: list[str]) -> None:
    config = tmp_path / "sharderd.toml"
    root = "true" if os.geteuid() == 0 else "false"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nbackend = "none"\nallow_root = {root}\n'
    )
    extra = ["--config", str(config)] if command[0] == "status" else [str(config)]
    code, err = _closed_stdout(*command, *extra, cwd=tmp_path)
    assert err == "" and code == 128 + signal.SIGPIPE
