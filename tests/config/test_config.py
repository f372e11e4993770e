"""sharderd.toml: one validated, frozen object; every error names the file, line and key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sharderd.cli import main
from sharderd.config import Config, load_config
from sharderd.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sharderd.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[plan]\nbatch_size = 2\nbogus = 1\n", ":3: [plan]: unknown key 'bogus'"),
        ("[plan]\n\nbatch_size = 0\n", ":3: [plan]: batch_size must be >= 1"),
        ("[daemon]\ninbox = 5\n", ":2: [daemon] inbox: expected a path string, got 5"),
        ("[nope]\nx = 1\n", ":1: unknown section or key 'nope'"),
        ("[plan\n", "invalid TOML"),
        ('[targets.x]\nbase = "ipu-mk2"\nfoo = 1\n', ":3: [targets.x]: unknown key 'foo'"),
        ('[search]\nbackend = "gpu"\n', ":2: [search] backend: 'gpu' is not one of"),
        ('[target]\nname = "nowhere"\n', "unknown target 'nowhere'"),
        (
            "[poprt]\nnum_io_tiles = 3\n",
            ":2: [poprt]: num_io_tiles must be 0 or an even number >= 32",
        ),
    ],
)
def test_errors_name_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    """A bad value or key is a ConfigError whose message points at it."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_config_is_frozen_and_custom_targets_resolve(tmp_path: Path) -> None:
    """A custom target starts from its base; the config object cannot be mutated."""
    path = write(
        tmp_path,
        '[target]\nname = "half"\n[targets.half]\nbase = "ipu-mk2"\nmemory_bytes = 470000000\n',
    )
    config = load_config(path)
    assert config.target().memory_bytes == 470_000_000
    assert config.target().tiles == 1472
    with pytest.raises(AttributeError):
        config.plan = None  # type: ignore[misc]


def test_check_config_prints_the_effective_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-config prints every section; its output loads back to the same config."""
    root = (
        "true" if os.geteuid() == 0 else "false"
    )  # what `run` accepts here (tests may run as root)
    text = f'[plan]\nbatch_size = 4\n[daemon]\nfile_mode = 0o600\nbackend = "none"\nallow_root = {root}\n'
    path = write(tmp_path, text)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "batch_size = 4" in out and "file_mode = 0o600" in out
    echoed = write(tmp_path, "\n".join(line for line in out.splitlines() if "# unset" not in line))
    assert load_config(echoed).plan == load_config(path).plan
    assert load_config(echoed).daemon == load_config(path).daemon


def test_check_config_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad config is exit 2 with the message on stderr and no traceback."""
    path = write(tmp_path, "[plan]\nsafety_margin = 0.5\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "safety_margin must be >= 1.0" in err and "Traceback" not in err


def test_defaults_without_a_file() -> None:
    """No file gives the documented defaults."""
    assert load_config(None) == Config()
