"""What the one-shot CLI shows while a job runs: a live table on a terminal (rich, when
installed), plain ``[event] key=value`` lines otherwise, nothing with ``--quiet``/``--json``.

It consumes the same ``emit(event, fields)`` stream the daemon logs, so both surfaces see the
same facts.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from sharderd.job.prove import Emit
from sharderd.units import fmt_seconds

__all__ = ["progress"]


def _plain(stream: TextIO) -> Emit:
    def emit(event: str, fields: Mapping[str, Any]) -> None:
        shown = " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, "", [], {}))
        print(f"[{event}] {shown}", file=stream, flush=True)

    return emit


class _Board:
    """The rows of the live table, updated from events."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str]] = {}

    def update(self, event: str, fields: Mapping[str, Any]) -> None:
        if event == "backend.selected":
            self.rows["backend"] = (str(fields.get("backend")), f"target {fields.get('target')}")
        elif event == "plan.started":
            self.rows["analyse"] = ("running", f"{fields.get('devices')} devices")
        elif event == "plan.finished":
            self.rows["analyse"] = ("done", "")
            label = fields.get("label", "plan")
            self.rows[f"plan: {label}"] = (
                "done",
                f"bottleneck {fmt_seconds(float(fields.get('bottleneck_s', 0)))}",
            )
        elif event == "attempt.started":
            self.rows[f"attempt {fields.get('attempt')}"] = (
                "running",
                str(fields.get("label", "")),
            )
        elif event == "attempt.finished":
            detail = str(fields.get("message", ""))[:80]
            if fields.get("device") is not None:
                detail = f"device {fields.get('device')}: {detail}"
            self.rows[f"attempt {fields.get('attempt')}"] = (
                str(fields.get("result")),
                f"{fields.get('duration_s')} s {detail}",
            )

    def render(self) -> Any:
        from rich.table import Table

        table = Table(show_header=False, box=None, pad_edge=False)
        colours = {
            "ok": "green",
            "done": "green",
            "running": "yellow",
            "oom": "red",
            "crashed": "magenta",
            "timeout": "red",
        }
        for step, (state, detail) in self.rows.items():
            table.add_row(step, f"[{colours.get(state, 'white')}]{state}[/]", detail)
        return table


@contextlib.contextmanager
def progress(*, quiet: bool, json_mode: bool, stream: TextIO | None = None) -> Iterator[Emit]:
    """Yield the ``emit`` callback for one CLI job."""
    out = stream or sys.stderr
    if quiet or json_mode:
        yield lambda event, fields: None
        return
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        yield _plain(out)
        return
    console = Console(file=out)
    if not console.is_terminal:
        yield _plain(out)
        return
    board = _Board()
    with Live(board.render(), console=console, refresh_per_second=8, transient=False) as live:

        def emit(event: str, fields: Mapping[str, Any]) -> None:
            board.update(event, fields)
            live.update(board.render())

        yield emit
