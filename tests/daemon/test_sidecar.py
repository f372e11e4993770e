"""sharderd.daemon.sidecar: per-job options over the daemon's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharderd.config import DaemonConfig
from sharderd.daemon.sidecar import JobOptions, load_sidecar
from sharderd.errors import ConfigError

DEFAULTS = DaemonConfig(devices=2, target="ipu-mk2", backend="none", max_attempts=5)


def sidecar(tmp_path: Path, text: str | bytes, name: str = "bert.toml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_no_sidecar_gives_daemon_defaults() -> None:
    """Without a sidecar a job gets the daemon's devices, target, backend and attempt limit."""
    assert load_sidecar(None, DEFAULTS) == JobOptions(2, "ipu-mk2", "none", False, 5, 0)
    assert load_sidecar(None, DEFAULTS, optimal_perf=True).optimal_perf is True


def test_every_key_overrides(tmp_path: Path) -> None:
    """Each sidecar key replaces its default; unset keys keep theirs."""
    path = sidecar(
        tmp_path,
        'devices = 8\ntarget = "ipu-bow"\nbackend = "onnxruntime"\n'
        "optimal_perf = true\npriority = -3\nmax_attempts = 2\n",
    )
    assert load_sidecar(path, DEFAULTS) == JobOptions(8, "ipu-bow", "onnxruntime", True, 2, -3)
    assert load_sidecar(sidecar(tmp_path, "priority = 9\n", "p.toml"), DEFAULTS) == JobOptions(
        2, "ipu-mk2", "none", False, 5, 9
    )


def test_empty_sidecar_is_defaults(tmp_path: Path) -> None:
    """An empty sidecar file changes nothing."""
    assert load_sidecar(sidecar(tmp_path, ""), DEFAULTS) == load_sidecar(None, DEFAULTS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "stages = 4\n",
            "sidecar bert.toml: unknown key 'stages' (known: devices, target, backend, optimal_perf, priority, max_attempts, input_shapes, dims, batch_size, name_nodes, precision, keep_dynamic)",
        ),
        ("devices = 0\n", "sidecar bert.toml: devices must be between 1 and 1024, got 0"),
        ("devices = 10000\n", "sidecar bert.toml: devices must be between 1 and 1024, got 10000"),
        ("devices = -1\n", "devices must be between 1 and 1024, got -1"),
        ('devices = "4"\n', "sidecar bert.toml devices: expected an integer, got '4'"),
        ("devices = 4.0\n", "expected an integer, got 4.0"),
        ("optimal_perf = 1\n", "optimal_perf: expected true or false, got 1"),
        ('backend = "tpu"\n', "backend: 'tpu' is not one of"),
        ("max_attempts = 0\n", "max_attempts must be between 1 and 100, got 0"),
        ('target = ""\n', "unknown target ''"),
        ("devices = [\n", "sidecar bert.toml: invalid TOML"),
        ("[job]\ndevices = 2\n", "unknown key 'job'"),
    ],
)
def test_bad_sidecars_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    """Every mistake is a ConfigError whose message names the sidecar and the key."""
    with pytest.raises(ConfigError) as info:
        load_sidecar(sidecar(tmp_path, text), DEFAULTS)
    assert message in str(info.value)


def test_folder_sidecar_named_with_its_folder(tmp_path: Path) -> None:
    """Errors in ``<name>/sharderd.toml`` say which folder's sidecar it is."""
    with pytest.raises(ConfigError, match=r"^sidecar bert/sharderd.toml: unknown key 'x'"):
        load_sidecar(sidecar(tmp_path, "x = 1\n", "bert/sharderd.toml"), DEFAULTS)


def test_unknown_target_when_targets_known(tmp_path: Path) -> None:
    """With the known targets given, a misspelt target is refused with the list."""
    path = sidecar(tmp_path, 'target = "ipu-mk3"\n')
    with pytest.raises(ConfigError, match=r"unknown target 'ipu-mk3' \(known: cpu, ipu-mk2\)"):
        load_sidecar(path, DEFAULTS, known_targets={"ipu-mk2", "cpu"})
    assert load_sidecar(path, DEFAULTS).target == "ipu-mk3"


def test_symlinked_sidecar_is_not_followed(tmp_path: Path) -> None:
    """A sidecar that is a link is refused without reading its target."""
    real = sidecar(tmp_path, "devices = 4\n", "real.toml")
    link = tmp_path / "bert.toml"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        load_sidecar(link, DEFAULTS)


def test_binary_and_huge_sidecars_refused(tmp_path: Path) -> None:
    """Non-UTF-8 bytes and files over 1 MiB are refused with a clear reason."""
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_sidecar(sidecar(tmp_path, b"devices = \xff\n"), DEFAULTS)
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_sidecar(sidecar(tmp_path, "#" * (2 << 20), "big.toml"), DEFAULTS)


def test_missing_sidecar_is_an_error(tmp_path: Path) -> None:
    """A sidecar path that vanished is a ConfigError, not an OSError."""
    with pytest.raises(ConfigError, match="cannot open"):
        load_sidecar(tmp_path / "gone.toml", DEFAULTS)


def test_devices_auto_runs_jobs_on_the_fewest_up_to_max_devices(tmp_path: Path) -> None:
    """``devices = "auto"`` gives each job max_devices as its ceiling and asks for the fewest;
    a sidecar's own device count is a count, not a ceiling."""
    auto = DaemonConfig(devices="auto", max_devices=8, backend="none", max_attempts=5)
    options = load_sidecar(None, auto)
    assert (options.devices, options.auto_devices) == (8, True)
    fixed = load_sidecar(sidecar(tmp_path, "devices = 4\n"), auto)
    assert (fixed.devices, fixed.auto_devices) == (4, False)
    assert load_sidecar(None, DEFAULTS).auto_devices is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[daemon]\ndevices = "auto"\n', 'max_devices must be set (>= 1) with devices = "auto"'),
        ('[daemon]\ndevices = "auto"\nmax_devices = 0\n', "max_devices must be set (>= 1)"),
        ('[daemon]\ndevices = "all"\n', "devices: expected an integer or 'auto', got 'all'"),
        ("[daemon]\ndevices = 0\n", 'devices must be >= 1 or "auto"'),
    ],
)
def test_devices_auto_needs_a_maximum(tmp_path: Path, text: str, message: str) -> None:
    from sharderd.config import load_config

    path = tmp_path / "sharderd.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in info.value.message
    ok = tmp_path / "ok.toml"
    ok.write_text('[daemon]\ndevices = "auto"\nmax_devices = 1\n', encoding="utf-8")
    assert load_config(ok).daemon.max_devices == 1
