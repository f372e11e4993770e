"""The HTML pieces every section uses; every report string passes through ``esc`` (node names are
user input).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

__all__ = ["esc", "html_table", "legend_html"]


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def html_table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str) -> str:
    """``rows`` are already-escaped cell HTML; a cell starting with ``#`` is right-aligned."""
    cells = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c[1:]}</td>' if c.startswith("#") else f"<td>{c}</td>" for c in row
        )
        + "</tr>"
        for row in rows
    )
    return (
        f'<table class="{cls}"><thead><tr>'
        + "".join(f"<th>{esc(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{cells}</tbody></table>"
    )


def legend_html(items: Iterable[tuple[str, str]]) -> str:
    return (
        '<p class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{esc(t)}</span>' for t, c in items)
        + "</p>"
    )
