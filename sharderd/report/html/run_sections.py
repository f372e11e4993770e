"""The run's sections: compile attempts, verification, warnings and the error; what the compiler
and the checks said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.report.attempts import attempts_heading
from sharderd.report.html.markup import esc, html_table, legend_html
from sharderd.report.measured import amp_of
from sharderd.report.svg import OUTCOME_COLOURS, attempt_note, attempts_timeline

__all__ = ["attempts_section", "error_section", "verification_section", "warnings_section"]


def _amp_text(amp: float | None, attempt: Mapping[str, Any]) -> str:
    """The session's AMP, and each stage's when some stage had its own."""
    stages = (attempt.get("options") or {}).get("stage_available_memory_proportion")
    if amp is None:
        return ""
    return f"{amp:g}" + (f" (per stage {' / '.join(f'{x:g}' for x in stages)})" if stages else "")


def attempts_section(report: Mapping[str, Any]) -> str:
    attempts = report["attempts"]
    if not attempts:
        return ""
    rows = []
    for a in attempts:
        outcome = str(a.get("outcome"))
        colour = OUTCOME_COLOURS.get(outcome, "#555")
        amp = amp_of(report, a)
        message = (a.get("message") or "").splitlines()[0][:200] if a.get("message") else ""
        rows.append(
            [
                f"#{esc(a.get('index'))}",
                esc(a.get("label", "")),
                f'<b style="color:{colour}">{esc(outcome)}</b>',
                f"#{float(a.get('duration_s') or 0):.2f} s",
                f"<code>{esc(a.get('plan_digest', ''))}</code>",
                esc(_amp_text(amp, a)),
                esc(attempt_note(a)),
                esc(message),
            ]
        )
    legend = legend_html(list(OUTCOME_COLOURS.items()))
    heading = attempts_heading(str(report.get("backend")))
    return (
        f'<section id="attempts"><h2>{esc(heading)}</h2>{legend}{attempts_timeline(attempts, title=heading)}'
        + html_table(
            ["#", "attempt", "outcome", "duration", "plan", "amp", "learned", "message"],
            rows,
            "attempts",
        )
        + "</section>"
    )


def verification_section(report: Mapping[str, Any]) -> str:
    v, source = report.get("verification"), ""
    if not v:  # a failed job has no chosen attempt: show what the last verifying attempt found
        last = next(
            (
                a
                for a in reversed(report["attempts"])
                if (a.get("details") or {}).get("verification")
            ),
            None,
        )
        if last is None:
            return ""
        v, source = last["details"]["verification"], f" (attempt {esc(last.get('index'))})"
    rows = [
        [
            f"<code>{esc(name)}</code>",
            f"#{float(o.get('max_abs', 0)):.3g}",
            f"#{float(o.get('max_rel', 0)):.3g}",
            '<span class="ok">ok</span>'
            if o.get("passed")
            else '<span class="bad">MISMATCH</span>',
            esc(o.get("problem") or ""),
        ]
        for name, o in (v.get("outputs") or {}).items()
    ]
    verdict = (
        '<span class="ok">passed</span>' if v.get("passed") else '<span class="bad">FAILED</span>'
    )
    return (
        f'<section id="verification"><h2>Verification{source}: {verdict}</h2><p>Sharded outputs against the original model, '
        f"rtol {esc(v.get('rtol'))}, atol {esc(v.get('atol'))}.</p>"
        + html_table(
            ["output", "max abs error", "max rel error", "result", "problem"], rows, "verification"
        )
        + "</section>"
    )


def _warning_tag(text: str) -> str:
    lowered = text.lower()
    for needle, tag in (
        ("default", "default cost"),
        ("renamed", "renamed"),
        ("shape", "shapes"),
        ("unknown", "shapes"),
    ):
        if needle in lowered:
            return tag
    return "note"


def warnings_section(report: Mapping[str, Any]) -> str:
    model = report["model"]
    items = [
        f'<li><span class="tag">{esc(_warning_tag(w))}</span>{esc(w)}</li>'
        for w in report["warnings"]
    ]
    facts = []
    if model.get("unresolved_dims"):
        facts.append(f"unresolved dimensions: {esc(', '.join(map(str, model['unresolved_dims'])))}")
    if model.get("unknown_size_tensors"):
        facts.append(
            f"{esc(model['unknown_size_tensors'])} tensor(s) of unknown size (counted as 0 bytes)"
        )
    if model.get("renamed_nodes"):
        facts.append(
            f"{esc(model['renamed_nodes'])} node(s) renamed to <code>&lt;OpType&gt;_&lt;k&gt;</code>"
        )
    items += [f'<li><span class="tag">model</span>{f}</li>' for f in facts]
    body = (
        f'<ul class="warnings">{"".join(items)}</ul>'
        if items
        else "<p>None: every shape known, every op costed.</p>"
    )
    return f'<section id="warnings"><h2>Warnings</h2>{body}</section>'


def error_section(report: Mapping[str, Any]) -> str:
    err = report.get("error")
    if not err:
        return ""
    hint = f"<p><b>What to do:</b> {esc(err['hint'])}</p>" if err.get("hint") else ""
    return (
        f'<section id="error" class="error"><h2>Error: {esc(err.get("reason", "error"))}</h2>'
        f"<p>{esc(err.get('message', ''))}</p>{hint}</section>"
    )
