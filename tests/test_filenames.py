"""sharderd.filenames: any name the filesystem allows, as text, as sharderd's own name, as a shell word."""

from __future__ import annotations

import json
import os
import subprocess
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharderd.filenames import MAX_NAME_BYTES, raw_bytes, safe_name, shell_word, text, text_values

NAMES = st.binary(min_size=1, max_size=255).filter(lambda b: b"/" not in b and b"\0" not in b)
"""Every name Linux allows: any bytes but ``/`` and NUL, 1 to 255 of them."""


def _name(raw: bytes) -> str:
    return os.fsdecode(raw)


def _printable(value: str) -> bool:
    return all(unicodedata.category(c) not in ("Cc", "Zl", "Zp", "Cs") for c in value)


class TestSafeName:
    def test_a_plain_name_is_unchanged(self) -> None:
        for name in ("resnet50", "my model (v2)", "-v2", "été", "模型", "50%"):
            assert safe_name(name) == name

    def test_bytes_that_are_not_utf8_and_controls_become_percent_escapes(self) -> None:
        assert safe_name(_name(b"\xe9t\xe9")) == "%E9t%E9"
        assert safe_name("a\nb\tc\x7f") == "a%0Ab%09c%7F"
        assert safe_name("a\u2028b") == "a%E2%80%A8b"

    def test_the_length_bound_just_inside_and_just_outside(self) -> None:
        """At ``MAX_NAME_BYTES`` a name is kept whole; one byte more and it is cut, ending in 8 hex
        digits of the original's sha256, at the bound exactly."""
        inside = "a" * MAX_NAME_BYTES
        assert safe_name(inside) == inside
        outside = "a" * (MAX_NAME_BYTES + 1)
        short = safe_name(outside)
        assert len(short.encode()) == MAX_NAME_BYTES
        assert short.startswith("a" * (MAX_NAME_BYTES - 9) + "-") and short != safe_name(
            "a" * (MAX_NAME_BYTES + 2)
        )

    def test_a_cut_never_splits_a_character_or_an_escape(self) -> None:
        for name in ("é" * 150, _name(b"\xe9" * 120), "x" + "é" * 120):
            short = safe_name(name)
            assert len(short.encode()) <= MAX_NAME_BYTES
            head = short.rsplit("-", 1)[0]
            assert head.encode().decode() == head  # whole characters
            assert head.count("%") * 3 == len(head) or "%" not in head

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(NAMES)
    def test_any_name_gives_printable_bounded_utf8(self, raw: bytes) -> None:
        """Whatever the bytes: valid UTF-8, printable, within the bound, no ``/``; and a name that
        is already all that is kept as it is."""
        name = _name(raw)
        safe = safe_name(name)
        assert 0 < len(safe.encode("utf-8")) <= MAX_NAME_BYTES
        assert _printable(safe) and "/" not in safe
        if len(raw) <= MAX_NAME_BYTES and _printable(name):
            assert safe == name
        assert raw_bytes(name) == raw


class TestText:
    def test_only_bytes_that_are_not_utf8_change(self) -> None:
        assert text("/inbox/a\nb.onnx") == "/inbox/a\nb.onnx"
        assert text(os.fsdecode(b"/inbox/\xe9t\xe9.onnx")) == "/inbox/%E9t%E9.onnx"

    def test_values_of_a_report_become_json_any_reader_takes(self) -> None:
        report = {"model": {"path": os.fsdecode(b"/x/\xff.onnx")}, "list": [os.fsdecode(b"\xfe")]}
        dumped = json.dumps(text_values(report), ensure_ascii=False)
        dumped.encode("utf-8")  # strict: no lone surrogate left
        assert "\\udc" not in json.dumps(text_values(report))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(NAMES, min_size=1, max_size=8))
def test_shell_word_passes_exactly_the_bytes_through_bash(names: list[bytes]) -> None:
    """``bash -c 'printf "%s\\0" WORD...'`` prints each name's own bytes: the commands error.md
    prints work as written, for a latin-1 name, a newline or a quote alike."""
    words = " ".join(shell_word(_name(raw)) for raw in names)
    words.encode("utf-8")  # the command itself is text
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {words}"], capture_output=True, check=True, timeout=30
    ).stdout
    assert out.split(b"\0")[:-1] == names


@pytest.mark.parametrize(
    ("raw", "word"),
    [(b"plain.onnx", "plain.onnx"), (b"a b", "'a b'"), (b"\xe9t\xe9", "$'\\xe9t\\xe9'")],
)
def test_shell_word_quotes_only_what_needs_it(raw: bytes, word: str) -> None:
    assert shell_word(_name(raw)) == word
