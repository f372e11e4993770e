"""sharderd.backends.poplar_sdk: the SDK's environment read off its enable script, written and read
back in systemd's EnvironmentFile= syntax, and poprt probed in it (fake SDK, fake poprt)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_sdk import FAKE_POPRT, make_sdk

from sharderd.backends.poplar_sdk import (
    SERVICE_PATH,
    SdkEnvironment,
    enable_script,
    expected_sdk,
    probe_poprt,
    read_env_file,
    render_env_file,
    sdk_environment,
    sdk_root,
)
from sharderd.errors import ConfigError

TRICKY = {
    "PLAIN": "/opt/sdk/lib",
    "SPACES": "  two  spaces around  ",
    "QUOTES": "say \"hi\" and 'bye'",
    "SHELL": "a $HOME, a ${X}, a `tick` and a \\ backslash",
    "LINES": "first line\nsecond line\n",
    "BACKSLASH_NEWLINE": "ends in a backslash\\\nthen a line",
    "COMMENTISH": "# not a comment; nor ; this = that",
    "EMPTY": "",
    "UNICODE": "Grüße ✓",
}


def test_the_environment_is_what_the_script_adds_or_changes(tmp_path: Path) -> None:
    script = make_sdk(
        tmp_path,
        extra='export POPLAR_NOTE="two\nlines"\nunset LANG\nexport BASH_FUNC_f%%=x 2>/dev/null || true',
    )
    env = sdk_environment(script)
    sdk = script.parent
    assert env.variables == {
        "POPLAR_SDK_ENABLED": f"{sdk}/poplar",
        "PATH": f"{sdk}/poplar/bin:{SERVICE_PATH}",
        "LD_LIBRARY_PATH": f"{sdk}/poplar/lib",  # the trailing ':' (the working directory) dropped
        "PYTHONPATH": str(FAKE_POPRT),
        "POPLAR_NOTE": "two\nlines",
    }
    assert env.unset == ("LANG",) and env.cleaned == ("LD_LIBRARY_PATH",)
    # HOME and the shell's own variables (PWD, SHLVL, _) are never the script's


def test_a_script_that_changes_nothing_gives_nothing(tmp_path: Path) -> None:
    script = tmp_path / "enable"
    script.write_text('export HOME="$HOME"\necho hello\n')
    assert sdk_environment(script).variables == {}


def test_a_failing_script_is_an_error_with_its_output(tmp_path: Path) -> None:
    script = make_sdk(tmp_path, extra='echo "cannot find libpoplar" >&2\nreturn 3')
    with pytest.raises(ConfigError) as raised:
        sdk_environment(script)
    assert "exit status 3" in raised.value.message
    assert "cannot find libpoplar" in raised.value.message


def test_a_missing_script_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        sdk_environment(tmp_path / "nope" / "enable")


def test_the_shell_that_runs_it_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own environment never leaks in: an SDK enabled in the caller's shell (which would make
    the script refuse), or a variable the caller set, changes nothing."""
    script = make_sdk(tmp_path)
    monkeypatch.setenv("POPLAR_SDK_ENABLED", "/elsewhere")
    monkeypatch.setenv("PYTHONPATH", "/mine")
    env = sdk_environment(script)
    assert env.variables["PYTHONPATH"] == str(FAKE_POPRT)


@pytest.mark.parametrize("key", list(TRICKY))
def test_every_value_survives_the_file(key: str) -> None:
    text = render_env_file(SdkEnvironment(Path("/x/enable"), TRICKY, (), (), ()), version="3.4.0")
    assert read_env_file(text)[key] == TRICKY[key]


def test_the_file_is_one_quoted_assignment_per_variable_after_a_comment() -> None:
    text = render_env_file(
        SdkEnvironment(Path("/x/enable"), {"A": "1", "B": 'x"$'}, (), (), ()), version=None
    )
    lines = text.splitlines()
    assert all(line.startswith("# ") for line in lines[:3])
    assert lines[3:] == ['A="1"', 'B="x\\"\\$"']


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=plain value   \n", {"A": "plain value"}),  # unquoted: trailing blanks go
        ("A='single $X \\n'\n", {"A": "single $X \\n"}),  # single quotes: nothing is special
        ('A="keep \\q"\n', {"A": "keep \\q"}),  # an unknown escape keeps its backslash
        ("A=con\\\ntinued\n", {"A": "continued"}),  # backslash-newline joins lines
        ('A="x"y z\n', {"A": "xy z"}),  # quoted and unquoted parts join
        ("# comment\n; comment\n\n  B = 2\n", {"B": "2"}),
        ("A=1\nA=2\n", {"A": "2"}),
        ("NOEQUALS\nC=3", {"C": "3"}),  # a line without '=' is ignored; no final newline
        ("9BAD=1\nOK_1=x\n", {"OK_1": "x"}),  # not a variable name: dropped, as systemd does
    ],
)
def test_read_follows_systemds_parser(text: str, expected: dict[str, str]) -> None:
    assert read_env_file(text) == expected


def test_sdk_root_and_version_from_paths() -> None:
    path = (
        "/usr/bin:/opt/poplar_sdk-ubuntu_20_04-3.3.0+1403-208993bbb7/poplar-ubuntu_20_04-3.3.0/bin"
    )
    assert sdk_root([path]) == (
        Path("/opt/poplar_sdk-ubuntu_20_04-3.3.0+1403-208993bbb7"),
        "3.3.0",
    )
    assert sdk_root(["/opt/sdk/enable", "/usr/lib"]) is None
    # an SDK unpacked under a folder of another name is found by its Poplar folder
    lib = "/software/graphcore/poplar_sdk/3.3.0/poplar-ubuntu_20_04-3.3.0+7857-b67b751185/lib"
    assert sdk_root([f"/usr/lib:{lib}"]) == (Path("/software/graphcore/poplar_sdk/3.3.0"), "3.3.0")


@pytest.mark.parametrize(
    ("poprt", "sdk"),
    [("1.5.0", "3.4"), ("1.4.0", "3.3"), ("1.3.0", "3.3"), ("1.2.0", "3.2"), ("1.0.2", "3.1")],
)
def test_poprt_releases_map_to_their_sdk(poprt: str, sdk: str) -> None:
    assert expected_sdk(poprt) == sdk


def test_an_unknown_poprt_release_has_no_sdk() -> None:
    assert expected_sdk("1.6.0") is None and expected_sdk("0.9.1") is None


def test_enable_script_names_the_newest_sdk(tmp_path: Path) -> None:
    assert enable_script(tmp_path) == f"{tmp_path}/poplar_sdk-VERSION/enable"
    make_sdk(tmp_path, "3.3.0")
    newest = make_sdk(tmp_path, "3.4.0")
    assert enable_script(tmp_path) == str(newest)


def test_probe_imports_the_fake_poprt_and_counts_its_ipus() -> None:
    env = {**os.environ, "PYTHONPATH": str(FAKE_POPRT), "FAKE_POPRT_IPUS": "4"}
    probe = probe_poprt(env)
    assert (probe.version, probe.ipus, probe.hardware, probe.error) == ("1.5.0", 4, "ipu2", None)


def test_probe_without_poprt_says_it_is_not_installed() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = probe_poprt(env)
    assert not probe.imports and probe.not_installed
    assert probe.error == "ModuleNotFoundError: No module named 'poprt'"


def test_probe_of_a_poprt_that_fails_to_load_is_not_called_missing(tmp_path: Path) -> None:
    """A poprt whose native library is missing imports with an error of its own: not 'install it'."""
    (tmp_path / "poprt").mkdir()
    (tmp_path / "poprt" / "__init__.py").write_text(
        "raise ImportError('libpoplar.so: cannot open shared object file')\n"
    )
    probe = probe_poprt({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert not probe.imports and not probe.not_installed
    assert probe.error is not None and "libpoplar.so" in probe.error


def test_probe_of_no_visible_ipu(tmp_path: Path) -> None:
    probe = probe_poprt({**os.environ, "PYTHONPATH": str(FAKE_POPRT), "FAKE_POPRT_IPUS": "0"})
    assert probe.imports and probe.ipus == 0 and probe.hardware is None
