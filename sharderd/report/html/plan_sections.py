"""The plan's sections: memory per device, predicted vs measured stage times, the split model,
routed inputs; why the model was split where it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.report.html.markup import esc, html_table, legend_html
from sharderd.report.markdown import TERMS_NOTE, TIME_TERMS, has_terms
from sharderd.report.measured import measurement
from sharderd.report.svg import MEMORY_PARTS, memory_bar, model_strip, stage_colour, time_chart
from sharderd.report.utilisation import stage_utilisation, utilisation_chart
from sharderd.units import fmt_bytes, fmt_flops, fmt_seconds

__all__ = ["memory_section", "routed_section", "split_section", "times_section"]


def memory_section(plan: Mapping[str, Any]) -> str:
    figures = []
    for s in plan["stages"]:
        k = int(s["index"])
        scale = plan["memory_scale"][k] if k < len(plan["memory_scale"]) else 1.0
        parts = ", ".join(f"{label} {esc(fmt_bytes(s[key]))}" for key, label, _ in MEMORY_PARTS)
        why = f"{plan['safety_margin']:g} margin" + (
            f" × {scale:.3g} learned correction" if scale != 1.0 else ""
        )
        figures.append(
            f'<figure class="device" data-stage="{k}" data-memory-bytes="{int(s["memory_bytes"])}">'
            f'<figcaption><b>device {k}</b> · <span class="used">{esc(fmt_bytes(s["memory_bytes"]))}</span> predicted: '
            f"{parts} · budget {esc(fmt_bytes(s['budget_bytes']))} = {esc(fmt_bytes(s['capacity_bytes']))} ÷ ({why})"
            f"</figcaption>{memory_bar(s)}</figure>"
        )
    legend = legend_html(
        [(label, colour) for _, label, colour in MEMORY_PARTS] + [("budget (dashed)", "#222")]
    )
    return f'<section id="memory"><h2>Memory per device</h2>{legend}<div class="devices">{"".join(figures)}</div></section>'


def times_section(report: Mapping[str, Any]) -> str:
    timed = [
        a
        for a in report["attempts"]
        if (a.get("benchmark") or {}).get("stage_times_s")
        or (a.get("details") or {}).get("stage_times_s")
    ]
    if not timed:
        return ""
    charts = []
    absolute = True
    for a in timed:
        measured = (a.get("benchmark") or {}).get("stage_times_s") or a["details"]["stage_times_s"]
        chosen = " (chosen)" if a.get("index") == report.get("chosen_attempt") else ""
        where = measurement(report, a)
        absolute = absolute and where.same_device
        how = (
            "absolute times, same kind of device"
            if where.same_device
            else "each stage's share of its profile's total: different devices, so only the shapes compare"
        )
        charts.append(
            f'<figure class="times" data-attempt="{esc(a.get("index"))}" '
            f'data-compare="{"absolute" if where.same_device else "shares"}">'
            f"{time_chart(a.get('predicted_stage_times_s') or [], measured, as_shares=not where.same_device)}"
            f"<figcaption><b>attempt {esc(a.get('index'))}{chosen}</b>: predicted for "
            f"<code>{esc(report['target']['name'])}</code> ({esc(a.get('cost_model', 'analytic'))} cost model), "
            f"measured with {esc(where.where)}; {esc(how)}. Plan <code>{esc(a.get('plan_digest', ''))}</code>"
            "</figcaption></figure>"
        )
    legend = legend_html([("predicted", "#a0b4cc"), ("measured", "#1f4e79")])
    title = (
        "Predicted vs measured time per stage"
        if absolute
        else "Predicted vs measured share of time per stage"
    )
    return (
        f'<section id="times"><h2>{title}</h2>{legend}'
        f'<div class="charts">{"".join(charts)}</div></section>'
    )


def split_section(plan: Mapping[str, Any]) -> str:
    cuts = "".join(
        f"<li>stage {int(c['cut']) - 1} → {int(c['cut'])}: <b>{esc(fmt_bytes(c['bytes']))}</b>: "
        + ", ".join(
            f"<code>{esc(t['name'])}</code> ({esc(fmt_bytes(t['bytes']))})" for t in c["tensors"]
        )
        + "</li>"
        for c in plan["cuts"]
    )
    terms = all(has_terms(s) for s in plan["stages"])
    keys = [k for k, _ in TIME_TERMS] if terms else ["comm_s"]
    rows = [
        [
            f'<span class="tag" style="background:{stage_colour(int(s["index"]))};color:#fff">{esc(s["index"])}</span>',
            f"#{esc(s['num_nodes'])}",
            f"<code>{esc(s['first_node'])}</code>",
            f"<code>{esc(s['last_node'])}</code>",
            f"#{esc(fmt_flops(s['flops']))}",
            f"#{esc(fmt_seconds(s['time_s']))}",
            f"#{stage_utilisation(s, plan['bottleneck_s']):.0%}",
            *(f"#{esc(fmt_seconds(s[k]))}" for k in keys),
        ]
        for s in plan["stages"]
    ]
    heads = [label for _, label in TIME_TERMS] if terms else ["of which comm"]
    table = html_table(
        ["stage", "nodes", "first node", "last node", "FLOPs", "time", "utilisation", *heads],
        rows,
        "stages",
    )
    if terms:
        table += f"<p>{esc(TERMS_NOTE.replace('`', ''))}</p>"
    return (
        f'<section id="model"><h2>The model, split</h2>{model_strip(plan["stages"], plan["cuts"], plan["slowest_stage"])}'
        f"<p>Order <code>{esc(plan['order'])}</code>; the slowest stage is outlined. Cut labels are the bytes "
        f"sent between neighbouring stages per batch.</p>"
        f'<figure class="utilisation">{utilisation_chart(plan["stages"], plan["bottleneck_s"])}'
        "<figcaption>Utilisation: each stage's predicted time over the slowest stage's. The "
        "pipeline runs at the pace of the slowest stage; a device below 100% waits for the rest "
        f"of each batch.</figcaption></figure>{table}"
        + (
            f'<details><summary>Tensors crossing each cut</summary><ul class="cuts">{cuts}</ul></details>'
            if cuts
            else ""
        )
        + "</section>"
    )


def routed_section(plan: Mapping[str, Any]) -> str:
    if not plan.get("routed_inputs"):
        return ""
    rows = [
        [
            f"<code>{esc(r['input'])}</code>",
            esc(", ".join(str(s) for s in r["stages"])),
            f"<code>{esc(r['node'])}</code>",
        ]
        for r in plan["routed_inputs"]
    ]
    return (
        '<section id="routed"><h2>Routed graph inputs</h2><p>PopART streams an input to one device; inputs read '
        "on several stages pass through an Identity on the first.</p>"
        + html_table(["input", "read on stages", "routing node"], rows, "routed")
        + "</section>"
    )
