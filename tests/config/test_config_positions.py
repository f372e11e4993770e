"""Config errors point at the line that defines the key, found in the TOML text, not in the message."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharderd.config import load_config
from sharderd.config.positions import key_lines, line_of
from sharderd.errors import ConfigError

TRICKY = '''# a comment that looks like [plan]
title = "x"  # c
[ plan ]
batch_size = 1
dims = { seq = 128, "a b" = { c = 1 } }
s = """
[fake]
k = 1 \\""" """
lit = \'\'\'
x = 2 \'\'\'\'\'
arr = [
  1, # comment [x]
  { y = 2 },
  "]",
]
[[plan.list]]
a.b."c.d" = 1
'q' = 2
[after]
z = 1979-05-27 07:32:00Z
"esc\\u0041\\"" = 3
'''


def test_every_table_and_key_has_its_line_and_strings_hide_nothing() -> None:
    tomllib.loads(TRICKY)  # the scanner's input is always a document tomllib accepted
    assert dict(key_lines(TRICKY)) == {
        ("title",): 2,
        ("plan",): 3,
        ("plan", "batch_size"): 4,
        ("plan", "dims"): 5,
        ("plan", "dims", "seq"): 5,
        ("plan", "dims", "a b"): 5,
        ("plan", "dims", "a b", "c"): 5,
        ("plan", "s"): 6,
        ("plan", "lit"): 9,
        ("plan", "arr"): 11,
        ("plan", "arr", "y"): 13,
        ("plan", "list"): 16,
        ("plan", "list", "a"): 17,
        ("plan", "list", "a", "b"): 17,
        ("plan", "list", "a", "b", "c.d"): 17,
        ("plan", "list", "q"): 18,
        ("after",): 19,
        ("after", "z"): 20,
        ("after", 'escA"'): 21,
    }


def test_a_missing_key_points_at_its_table_and_an_implied_table_at_its_first_use() -> None:
    text = "[a.b]\nx = 1\n[a]\ny = 2\n[c]\nd.e = 3\n"
    assert line_of(text, ("a", "b", "missing")) == 1
    assert line_of(text, ("a",)) == 3  # defined by its header, though [a.b] implied it first
    assert line_of(text, ("c", "d")) == 6
    assert line_of(text, ("nowhere",)) is None


_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=6)
_SCALARS = st.one_of(st.integers(), st.booleans(), _NAMES, st.lists(st.integers(), max_size=3))


def _quote(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_NAMES, st.dictionaries(_NAMES, _SCALARS, max_size=4), max_size=4))
def test_lines_match_a_document_written_line_by_line(tables: dict[str, dict[str, Any]]) -> None:
    """Write tables and keys (lists one item a line, comments that look like headers), noting
    each line; the scanner finds exactly those lines."""
    lines: list[str] = []
    expected: dict[tuple[str, ...], int] = {}
    for table, keys in tables.items():
        lines.append(f"[{_quote(table)}]  # [not.a.table]")
        expected[(table,)] = len(lines)
        for key, value in keys.items():
            if isinstance(value, list):
                lines.append(f"{_quote(key)} = [  # x = 1")
                expected[(table, key)] = len(lines)
                lines += [f"  {v},  # [{v}]" for v in value] + ["]"]
            else:
                lines.append(f"{_quote(key)} = {_scalar(value)}")
                expected[(table, key)] = len(lines)
    text = "\n".join(lines) + "\n"
    assert tomllib.loads(text) == tables
    assert dict(key_lines(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("top = 1\n", ":1: unknown section or key 'top'"),
        ("\n\n[plan]\ndims.seq = 0\n", ":4: [plan]: dims.seq must be an integer >= 1"),
        ("[plan.dims]\n\nseq = 0\n", ":3: [plan]: dims.seq must be an integer >= 1"),
        ('[plan]\n"batch_size" = 0\n', ":2: [plan]: batch_size must be >= 1"),
        ('[plan]\ns = """\nbatch_size = 0\n"""\n', ":2: [plan]: unknown key 's'"),
        (
            '[cluster]\nnum_cpus = 1\nengine = "ray"\n',
            ':1: [cluster]: shared_dir must be set when engine = "ray"',
        ),
        (
            '[targets."my ipu"]\nbase = "ipu-mk2"\nbogus = 1\n',
            ":3: [targets.my ipu]: unknown key 'bogus'",
        ),
        ("[targets.x]\ntiles = 4\n", ":1: [targets.x]: missing key 'kind'"),
    ],
)
def test_errors_carry_the_line_of_their_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "sharderd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}{expected}" in str(info.value)
