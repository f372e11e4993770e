"""The report of a duplicate daemon job: same content as an earlier job, so nothing was computed.

The submitter of the second copy looks for ``outbox/<name>/`` and its ``report.*``; they find this
one, which says whose result it is and where it is, instead of nothing (or, worse, a copy of the
first job's report under the first job's title).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from sharderd import __version__
from sharderd.report.build import SCHEMA

__all__ = [
    "DUPLICATE_FILE",
    "duplicate_report",
    "render_duplicate_html",
    "render_duplicate_markdown",
    "write_duplicate",
]

DUPLICATE_FILE = "duplicate.json"
"""The machine-readable pointer in a duplicate's outbox folder (the same facts as report.json)."""


def duplicate_report(
    *, name: str, job_id: str, sha256: str, original_job_id: str, original_result: Path
) -> dict[str, Any]:
    """``report.json`` of a duplicate: ``status`` ``duplicate`` and where the first result is."""
    return {
        "schema": SCHEMA,
        "sharderd_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "status": "duplicate",
        "name": name,
        "job_id": job_id,
        "content_sha256": sha256,
        "duplicate_of": {
            "job_id": original_job_id,
            "name": original_result.name,
            "result": str(original_result),
        },
    }


def render_duplicate_markdown(report: Mapping[str, Any]) -> str:
    first = report["duplicate_of"]
    return (
        f"# sharderd report: {report['name']}: duplicate\n\n"
        f"- status: **duplicate** of job `{first['job_id']}` (`{first['name']}`)\n"
        f"- job id: `{report['job_id']}`\n\n"
        "The same model bytes with the same effective options were sharded before, so nothing was computed "
        f"again. The result, with its report, is in `{first['result']}`.\n"
    )


def render_duplicate_html(report: Mapping[str, Any], link: str) -> str:
    """``link``: the first result's ``report.html``, relative to this folder so the page works when opened."""
    first = report["duplicate_of"]
    title = f"sharderd report: {report['name']}: duplicate"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title></head><body>"
        f'<h1>{escape(title)} <span data-status="duplicate">duplicate</span></h1>'
        f"<p>Job <code>{escape(report['job_id'])}</code> has the same model bytes and effective options as job "
        f"<code>{escape(first['job_id'])}</code>, so nothing was computed again. Its result is "
        f'<code>{escape(first["result"])}</code>: <a href="{escape(link, quote=True)}">its report</a>.</p>'
        f"<footer>sharderd {escape(report['sharderd_version'])} · {escape(report['schema'])}</footer></body></html>\n"
    )


def write_duplicate(report: Mapping[str, Any], folder: Path) -> None:
    """``report.json``/``.md``/``.html`` and ``duplicate.json`` of a duplicate into ``folder``."""
    original = Path(report["duplicate_of"]["result"])
    link = os.path.relpath(original / "report.html", folder.parent / report["name"])
    text = json.dumps(report, indent=1) + "\n"
    (folder / "report.json").write_text(text, encoding="utf-8")
    (folder / DUPLICATE_FILE).write_text(text, encoding="utf-8")
    (folder / "report.md").write_text(render_duplicate_markdown(report), encoding="utf-8")
    (folder / "report.html").write_text(render_duplicate_html(report, link), encoding="utf-8")
