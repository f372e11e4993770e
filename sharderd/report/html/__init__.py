"""``report.html``: the facts of ``report.json`` as one self-contained page an engineer can open
from the outbox: why the model was split where it was, and what the compiler said about it.

No scripts, no network, no fonts to fetch: inline CSS and inline SVG (sharderd.report.svg) only.
Every string taken from the report is escaped (node names are user input).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.report.html.facts import facts_list
from sharderd.report.html.markup import esc
from sharderd.report.html.plan_sections import (
    memory_section,
    routed_section,
    split_section,
    times_section,
)
from sharderd.report.html.run_sections import (
    attempts_section,
    error_section,
    verification_section,
    warnings_section,
)
from sharderd.report.html.style import PAGE_CSS

__all__ = ["render_html"]


def render_html(report: Mapping[str, Any]) -> str:
    plan = report.get("plan")
    status = str(report["status"])
    sections = [error_section(report)]
    if plan is not None:
        sections += [
            memory_section(plan),
            times_section(report),
            split_section(plan),
            routed_section(plan),
        ]
    sections += [attempts_section(report), verification_section(report), warnings_section(report)]
    files = "".join(
        f"<li>{esc(k)}: <code>{esc(v)}</code></li>"
        for k, v in report.get("outputs", {}).items()
        if v
    )
    if files:
        sections.append(f'<section id="files"><h2>Files</h2><ul>{files}</ul></section>')
    title = f"sharderd report: {report['model']['name']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{PAGE_CSS}</style></head><body>"
        f'<header><h1>{esc(title)} <span class="status status-{esc(status)}" data-status="{esc(status)}">{esc(status)}</span></h1>'
        f"{facts_list(report)}</header><main>{''.join(sections)}</main>"
        f"<footer>sharderd {esc(report.get('sharderd_version', ''))} · {esc(report.get('schema', ''))} · "
        f"created {esc(report.get('created', ''))} · plan digest <code>{esc((plan or {}).get('digest', 'n/a'))}</code></footer>"
        "</body></html>\n"
    )
