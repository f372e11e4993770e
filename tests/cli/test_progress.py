"""The CLI's progress: plain lines when not a terminal, a live table on one, silence when asked."""

from __future__ import annotations

import io

import pytest

from sharderd.cli import progress as progress_module
from sharderd.cli.progress import progress

EVENTS = [
    ("backend.selected", {"backend": "poprt", "target": "ipu-mk2"}),
    ("plan.started", {"devices": 4}),
    ("plan.finished", {"label": "plan", "bottleneck_s": 0.002}),
    ("attempt.started", {"attempt": 0, "label": "plan"}),
    (
        "attempt.finished",
        {
            "attempt": 0,
            "result": "oom",
            "duration_s": 1.5,
            "device": 2,
            "message": "Out of memory on tile 3000",
        },
    ),
]


def test_plain_lines_when_not_a_terminal() -> None:
    """A pipe gets one ``[event] key=value`` line per event, empty fields left out."""
    out = io.StringIO()
    with progress(quiet=False, json_mode=False, stream=out) as emit:
        for event, fields in EVENTS:
            emit(event, {**fields, "empty": None})
    lines = out.getvalue().splitlines()
    assert lines[0] == "[backend.selected] backend=poprt target=ipu-mk2"
    assert lines[-1].startswith("[attempt.finished] attempt=0 result=oom duration_s=1.5 device=2")
    assert "empty" not in out.getvalue()


@pytest.mark.parametrize(("quiet", "json_mode"), [(True, False), (False, True)])
def test_quiet_and_json_print_nothing(quiet: bool, json_mode: bool) -> None:
    """--quiet and --json keep stderr clean."""
    out = io.StringIO()
    with progress(quiet=quiet, json_mode=json_mode, stream=out) as emit:
        for event, fields in EVENTS:
            emit(event, fields)
    assert out.getvalue() == ""


def test_live_table_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the rows show each step's state, the OOM device included."""
    pytest.importorskip("rich")
    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(
        "rich.console.Console", lambda file: Console(file=file, force_terminal=True, width=120)
    )
    board = progress_module._Board()
    with progress(quiet=False, json_mode=False, stream=out) as emit:
        for event, fields in EVENTS:
            emit(event, fields)
            board.update(event, fields)
    assert board.rows["attempt 0"][0] == "oom" and "device 2" in board.rows["attempt 0"][1]
    text = out.getvalue()
    assert "attempt 0" in text and "oom" in text and "\x1b[" in text
