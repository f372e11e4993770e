"""``report.html``: the facts of ``report.json`` as one self-contained page an engineer can open
from the outbox: why the model was split where it was, and what the compiler said about it.

No scripts, no network, no fonts to fetch: inline CSS and inline SVG (sharderd.report.svg) only.
Every string taken from the report is escaped (node names are user input).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from sharderd.report.markdown import TERMS_NOTE, TIME_TERMS, has_terms
from sharderd.report.measured import amp_of, measurement, status_label
from sharderd.report.svg import (
    MEMORY_PARTS,
    OUTCOME_COLOURS,
    attempt_note,
    attempts_timeline,
    memory_bar,
    model_strip,
    stage_colour,
    time_chart,
)
from sharderd.units import fmt_bytes, fmt_flops, fmt_seconds

__all__ = ["render_html"]

_CSS = """
:root{color-scheme:light;--fg:#1d232a;--muted:#5b6570;--line:#d9dee3}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 margin:0 auto;padding:20px 28px 40px;max-width:1200px;background:#fff}
h1{font-size:24px;margin:0 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:6px 18px;margin:10px 0 0}
.facts div{border-left:3px solid var(--line);padding:2px 8px}.facts dt{color:var(--muted);font-size:12px}
.facts dd{margin:0;font-weight:600}
.status{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:700;font-size:13px}
.status-compiled{background:#2e7d32}.status-not_compiled,.status-planned{background:#1565c0}
.status-failed,.status-does_not_fit{background:#c62828}
.devices{display:grid;grid-template-columns:1fr;gap:2px}
figure{margin:4px 0}figcaption{font-size:13px;color:var(--muted)}figcaption b{color:var(--fg)}
svg{max-width:100%;height:auto;font-family:inherit;display:block}
svg text{font-size:13px;fill:var(--fg)}svg .small{font-size:12px}svg .tiny{font-size:11px;fill:var(--muted)}
svg .on-colour{fill:#fff;font-weight:600}
.legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}th{background:#f3f5f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#2e7d32;font-weight:700}.bad{color:#c62828;font-weight:700}
.error{border:2px solid #c62828;background:#fff4f4;padding:2px 14px 8px;border-radius:4px;margin-top:18px}
.tag{display:inline-block;font-size:11px;padding:0 6px;margin-right:6px;border-radius:8px;background:#eceff1}
.charts{display:flex;flex-wrap:wrap;gap:10px 28px}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str) -> str:
    """``rows`` are already-escaped cell HTML; a cell starting with ``#`` is right-aligned."""
    cells = "".join(
        "<tr>" + "".join(f'<td class="num">{c[1:]}</td>' if c.startswith("#") else f"<td>{c}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr></thead><tbody>{cells}</tbody></table>"


def _legend(items: Iterable[tuple[str, str]]) -> str:
    return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_e(t)}</span>' for t, c in items) + "</p>"


def _facts(report: Mapping[str, Any]) -> str:
    model, target, plan = report["model"], report["target"], report.get("plan")
    facts: list[tuple[str, str, str]] = [
        ("model", "model", f"<code>{_e(model['name'])}</code>: {_e(model['nodes'])} nodes, {_e(fmt_flops(model['flops']))}, "
                           f"weights {_e(fmt_bytes(model['weight_bytes']))}"),
        ("target", "target", f"<code>{_e(target['name'])}</code>: {_e(fmt_bytes(target['memory_bytes']))} per device"),
        ("backend", "backend", f"<code>{_e(report['backend'])}</code>"),
    ]
    if plan is not None:
        ratio = plan["ratio_to_bound"]
        tput = plan.get("predicted_throughput_per_s")
        facts += [
            ("devices", "devices", _e(plan["devices"])),
            ("bottleneck", "bottleneck", f"stage {_e(plan['slowest_stage'])}, {_e(fmt_seconds(plan['bottleneck_s']))} per batch"),
            ("bound", "lower bound", f"{_e(fmt_seconds(plan['lower_bound_s']))} (ratio {ratio:.3f})"),
            ("throughput", "predicted throughput",
             f"{tput:.1f} samples/s (batch {_e(report['batch_size'])}) on <code>{_e(target['name'])}</code>, "
             "cost model" if tput else "n/a"),
        ]
    bench = report.get("benchmark")
    if bench:
        where = measurement(report)
        note = "" if where.same_device else "; a different device from the prediction's: the numbers do not compare"
        facts.append(("measured", "measured throughput",
                      f"{bench['throughput_per_s']:.1f} samples/s with {_e(where.where)}{_e(note)}"))
    if report.get("verification"):
        ok = report["verification"].get("passed")
        facts.append(("verification", "verification", '<span class="ok">passed</span>' if ok else '<span class="bad">FAILED</span>'))
    return '<dl class="facts">' + "".join(
        f'<div data-fact="{key}"><dt>{_e(label)}</dt><dd>{html}</dd></div>' for key, label, html in facts) + "</dl>"


def _memory(plan: Mapping[str, Any]) -> str:
    figures = []
    for s in plan["stages"]:
        k = int(s["index"])
        scale = plan["memory_scale"][k] if k < len(plan["memory_scale"]) else 1.0
        parts = ", ".join(f"{label} {_e(fmt_bytes(s[key]))}" for key, label, _ in MEMORY_PARTS)
        why = f"{plan['safety_margin']:g} margin" + (f" × {scale:.3g} learned correction" if scale != 1.0 else "")
        figures.append(
            f'<figure class="device" data-stage="{k}" data-memory-bytes="{int(s["memory_bytes"])}">'
            f"<figcaption><b>device {k}</b> · <span class=\"used\">{_e(fmt_bytes(s['memory_bytes']))}</span> predicted: "
            f"{parts} · budget {_e(fmt_bytes(s['budget_bytes']))} = {_e(fmt_bytes(s['capacity_bytes']))} ÷ ({why})"
            f"</figcaption>{memory_bar(s)}</figure>"
        )
    legend = _legend([(label, colour) for _, label, colour in MEMORY_PARTS] + [("budget (dashed)", "#222")])
    return f'<section id="memory"><h2>Memory per device</h2>{legend}<div class="devices">{"".join(figures)}</div></section>'


def _times(report: Mapping[str, Any]) -> str:
    timed = [a for a in report["attempts"] if (a.get("benchmark") or {}).get("stage_times_s")
             or (a.get("details") or {}).get("stage_times_s")]
    if not timed:
        return ""
    charts = []
    absolute = True
    for a in timed:
        measured = (a.get("benchmark") or {}).get("stage_times_s") or a["details"]["stage_times_s"]
        chosen = " (chosen)" if a.get("index") == report.get("chosen_attempt") else ""
        where = measurement(report, a)
        absolute = absolute and where.same_device
        how = ("absolute times, same kind of device" if where.same_device else
               "each stage's share of its profile's total: different devices, so only the shapes compare")
        charts.append(f'<figure class="times" data-attempt="{_e(a.get("index"))}" '
                      f'data-compare="{"absolute" if where.same_device else "shares"}">'
                      f"{time_chart(a.get('predicted_stage_times_s') or [], measured, as_shares=not where.same_device)}"
                      f"<figcaption><b>attempt {_e(a.get('index'))}{chosen}</b>: predicted for "
                      f"<code>{_e(report['target']['name'])}</code> ({_e(a.get('cost_model', 'analytic'))} cost model), "
                      f"measured with {_e(where.where)}; {_e(how)}. Plan <code>{_e(a.get('plan_digest', ''))}</code>"
                      "</figcaption></figure>")
    legend = _legend([("predicted", "#a0b4cc"), ("measured", "#1f4e79")])
    title = "Predicted vs measured time per stage" if absolute else "Predicted vs measured share of time per stage"
    return (f'<section id="times"><h2>{title}</h2>{legend}'
            f'<div class="charts">{"".join(charts)}</div></section>')


def _strip(plan: Mapping[str, Any]) -> str:
    cuts = "".join(
        f"<li>stage {int(c['cut']) - 1} → {int(c['cut'])}: <b>{_e(fmt_bytes(c['bytes']))}</b>: "
        + ", ".join(f"<code>{_e(t['name'])}</code> ({_e(fmt_bytes(t['bytes']))})" for t in c["tensors"]) + "</li>"
        for c in plan["cuts"])
    terms = all(has_terms(s) for s in plan["stages"])
    keys = [k for k, _ in TIME_TERMS] if terms else ["comm_s"]
    rows = [[f"<span class=\"tag\" style=\"background:{stage_colour(int(s['index']))};color:#fff\">{_e(s['index'])}</span>",
             f"#{_e(s['num_nodes'])}", f"<code>{_e(s['first_node'])}</code>", f"<code>{_e(s['last_node'])}</code>",
             f"#{_e(fmt_flops(s['flops']))}", f"#{_e(fmt_seconds(s['time_s']))}",
             *(f"#{_e(fmt_seconds(s[k]))}" for k in keys)]
            for s in plan["stages"]]
    heads = [label for _, label in TIME_TERMS] if terms else ["of which comm"]
    table = _table(["stage", "nodes", "first node", "last node", "FLOPs", "time", *heads], rows, "stages")
    if terms:
        table += f"<p>{_e(TERMS_NOTE.replace('`', ''))}</p>"
    return (f'<section id="model"><h2>The model, split</h2>{model_strip(plan["stages"], plan["cuts"], plan["slowest_stage"])}'
            f"<p>Order <code>{_e(plan['order'])}</code>; the slowest stage is outlined. Cut labels are the bytes "
            f"sent between neighbouring stages per batch.</p>{table}"
            + (f"<details><summary>Tensors crossing each cut</summary><ul class=\"cuts\">{cuts}</ul></details>" if cuts else "")
            + "</section>")


def _routed(plan: Mapping[str, Any]) -> str:
    if not plan.get("routed_inputs"):
        return ""
    rows = [[f"<code>{_e(r['input'])}</code>", _e(", ".join(str(s) for s in r["stages"])), f"<code>{_e(r['node'])}</code>"]
            for r in plan["routed_inputs"]]
    return ('<section id="routed"><h2>Routed graph inputs</h2><p>PopART streams an input to one device; inputs read '
            "on several stages pass through an Identity on the first.</p>"
            + _table(["input", "read on stages", "routing node"], rows, "routed") + "</section>")


def _attempts(report: Mapping[str, Any]) -> str:
    attempts = report["attempts"]
    if not attempts:
        return ""
    rows = []
    for a in attempts:
        outcome = str(a.get("outcome"))
        colour = OUTCOME_COLOURS.get(outcome, "#555")
        amp = amp_of(report, a)
        message = (a.get("message") or "").splitlines()[0][:200] if a.get("message") else ""
        rows.append([f"#{_e(a.get('index'))}", _e(a.get("label", "")),
                     f'<b style="color:{colour}">{_e(outcome)}</b>', f"#{float(a.get('duration_s') or 0):.2f} s",
                     f"<code>{_e(a.get('plan_digest', ''))}</code>", _e("" if amp is None else f"{amp:g}"),
                     _e(attempt_note(a)), _e(message)])
    legend = _legend(list(OUTCOME_COLOURS.items()))
    return (f'<section id="attempts"><h2>Compile attempts</h2>{legend}{attempts_timeline(attempts)}'
            + _table(["#", "attempt", "outcome", "duration", "plan", "amp", "learned", "message"], rows, "attempts")
            + "</section>")


def _verification(report: Mapping[str, Any]) -> str:
    v, source = report.get("verification"), ""
    if not v:  # a failed job has no chosen attempt: show what the last verifying attempt found
        last = next((a for a in reversed(report["attempts"]) if (a.get("details") or {}).get("verification")), None)
        if last is None:
            return ""
        v, source = last["details"]["verification"], f" (attempt {_e(last.get('index'))})"
    rows = [[f"<code>{_e(name)}</code>", f"#{float(o.get('max_abs', 0)):.3g}", f"#{float(o.get('max_rel', 0)):.3g}",
             '<span class="ok">ok</span>' if o.get("passed") else '<span class="bad">MISMATCH</span>', _e(o.get("problem") or "")]
            for name, o in (v.get("outputs") or {}).items()]
    verdict = '<span class="ok">passed</span>' if v.get("passed") else '<span class="bad">FAILED</span>'
    return (f'<section id="verification"><h2>Verification{source}: {verdict}</h2><p>Sharded outputs against the original model, '
            f"rtol {_e(v.get('rtol'))}, atol {_e(v.get('atol'))}.</p>"
            + _table(["output", "max abs error", "max rel error", "result", "problem"], rows, "verification") + "</section>")


def _warning_tag(text: str) -> str:
    lowered = text.lower()
    for needle, tag in (("default", "default cost"), ("renamed", "renamed"), ("shape", "shapes"), ("unknown", "shapes")):
        if needle in lowered:
            return tag
    return "note"


def _warnings(report: Mapping[str, Any]) -> str:
    model = report["model"]
    items = [f'<li><span class="tag">{_e(_warning_tag(w))}</span>{_e(w)}</li>' for w in report["warnings"]]
    facts = []
    if model.get("unresolved_dims"):
        facts.append(f"unresolved dimensions: {_e(', '.join(map(str, model['unresolved_dims'])))}")
    if model.get("unknown_size_tensors"):
        facts.append(f"{_e(model['unknown_size_tensors'])} tensor(s) of unknown size (counted as 0 bytes)")
    if model.get("renamed_nodes"):
        facts.append(f"{_e(model['renamed_nodes'])} node(s) renamed to <code>&lt;OpType&gt;_&lt;k&gt;</code>")
    items += [f'<li><span class="tag">model</span>{f}</li>' for f in facts]
    body = f'<ul class="warnings">{"".join(items)}</ul>' if items else "<p>None: every shape known, every op costed.</p>"
    return f'<section id="warnings"><h2>Warnings</h2>{body}</section>'


def _error(report: Mapping[str, Any]) -> str:
    err = report.get("error")
    if not err:
        return ""
    hint = f"<p><b>What to do:</b> {_e(err['hint'])}</p>" if err.get("hint") else ""
    return (f'<section id="error" class="error"><h2>Error: {_e(err.get("reason", "error"))}</h2>'
            f"<p>{_e(err.get('message', ''))}</p>{hint}</section>")


def render_html(report: Mapping[str, Any]) -> str:
    plan = report.get("plan")
    status = str(report["status"])
    sections = [_error(report)]
    if plan is not None:
        sections += [_memory(plan), _times(report), _strip(plan), _routed(plan)]
    sections += [_attempts(report), _verification(report), _warnings(report)]
    files = "".join(f"<li>{_e(k)}: <code>{_e(v)}</code></li>" for k, v in report.get("outputs", {}).items() if v)
    if files:
        sections.append(f'<section id="files"><h2>Files</h2><ul>{files}</ul></section>')
    title = f"sharderd report: {report['model']['name']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>{_e(title)} <span class="status status-{_e(status)}" data-status="{_e(status)}">{_e(status_label(report))}</span></h1>'
        f"{_facts(report)}</header><main>{''.join(sections)}</main>"
        f"<footer>sharderd {_e(report.get('sharderd_version', ''))} · {_e(report.get('schema', ''))} · "
        f"created {_e(report.get('created', ''))} · plan digest <code>{_e((plan or {}).get('digest', 'n/a'))}</code></footer>"
        "</body></html>\n"
    )
