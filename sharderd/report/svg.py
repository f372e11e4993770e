"""Inline SVG charts for ``report.html``: pure functions from report numbers to markup.

Every chart is a self-contained ``<svg role="img">`` whose ``<title>``/``<desc>`` carry its text
alternative, and every string that came from the report (node and tensor names are user input) is
escaped here, so a caller can paste the result into HTML as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from sharderd.report.measured import shares
from sharderd.units import fmt_bytes, fmt_seconds

__all__ = [
    "MEMORY_PARTS",
    "OUTCOME_COLOURS",
    "attempt_note",
    "attempts_timeline",
    "memory_bar",
    "model_strip",
    "stage_colour",
    "time_chart",
]

_STAGE_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#e15759",
    "#bab0ac",
)
MEMORY_PARTS = (
    ("weight_bytes", "weights", "#4e79a7"),
    ("activation_bytes", "activations", "#f28e2b"),
    ("code_bytes", "code", "#b07aa1"),
)
"""(stage field, label, colour) in stacking order."""
OUTCOME_COLOURS = {
    "ok": "#2e7d32",
    "oom": "#c62828",
    "invalid": "#ef6c00",
    "crashed": "#6a1b9a",
    "timeout": "#b8860b",
    "cancelled": "#9e9e9e",
}
_MIN_PX = 1.5
"""A non-zero quantity never disappears: a 1 % sliver of a device still shows."""


def stage_colour(index: int) -> str:
    return _STAGE_COLOURS[index % len(_STAGE_COLOURS)]


def _n(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def _svg(cls: str, width: float, height: float, title: str, desc: str, body: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" role="img" viewBox="0 0 {_n(width)} {_n(height)}" '
        f'width="{_n(width)}" height="{_n(height)}"><title>{escape(title)}</title><desc>{escape(desc)}</desc>'
        + "".join(body)
        + "</svg>"
    )


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str, extra: str = "") -> str:
    return (
        f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{fill}"{extra}>'
        f"<title>{escape(title)}</title></rect>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


def memory_bar(stage: Mapping[str, Any], width: float = 1140) -> str:
    """One device: weights, activations and code stacked against the whole device, the planner's
    budget as a dashed line. The axis is the device's capacity, not the data: how full it is *is*
    the message."""
    capacity = max(int(stage["capacity_bytes"]), 1)
    left, right, top, bar_h = 8, 8, 16, 26
    scale = (width - left - right) / capacity
    body, x = [], float(left)
    for key, label, colour in MEMORY_PARTS:
        value = int(stage[key])
        w = max(value * scale, _MIN_PX) if value else 0.0
        detail = (
            f" (incl. {fmt_bytes(stage['recv_bytes'])} received, {fmt_bytes(stage['send_bytes'])} to send)"
            if key == "activation_bytes"
            else ""
        )
        body.append(
            _rect(
                x,
                top,
                w,
                bar_h,
                colour,
                f"{label}: {fmt_bytes(value)}{detail}",
                f' class="seg seg-{label}" data-bytes="{value}"',
            )
        )
        x += w
    body.insert(
        0,
        _rect(
            left,
            top,
            width - left - right,
            bar_h,
            "#eef0f3",
            f"capacity {fmt_bytes(capacity)}",
            ' class="capacity" stroke="#9aa3ad"',
        ),
    )
    budget = int(stage["budget_bytes"])
    bx = left + min(budget, capacity) * scale
    over = int(stage["memory_bytes"]) > budget
    body.append(
        f'<line class="budget" x1="{_n(bx)}" x2="{_n(bx)}" y1="{top - 8}" y2="{top + bar_h + 6}" '
        f'stroke="{"#c62828" if over else "#222"}" stroke-width="2" stroke-dasharray="5 3">'
        f"<title>budget {escape(fmt_bytes(budget))}</title></line>"
    )
    anchor = "end" if bx > width * 0.8 else "start"
    body.append(
        _text(
            bx + (-4 if anchor == "end" else 4),
            top - 4,
            f"budget {fmt_bytes(budget)}",
            anchor,
            "small",
        )
    )
    body.append(
        _text(width - right, top + bar_h + 16, f"capacity {fmt_bytes(capacity)}", "end", "small")
    )
    used = int(stage["memory_bytes"])
    body.append(
        _text(
            left,
            top + bar_h + 16,
            f"used {fmt_bytes(used)} ({100 * used / capacity:.1f} %)",
            "start",
            "small",
        )
    )
    desc = (
        f"{fmt_bytes(used)} of {fmt_bytes(capacity)} predicted: "
        + ", ".join(f"{label} {fmt_bytes(int(stage[key]))}" for key, label, _ in MEMORY_PARTS)
        + f"; budget {fmt_bytes(budget)}"
        + (" (over budget)" if over else "")
    )
    return _svg(
        "memory-chart", width, top + bar_h + 22, f"Memory of device {stage['index']}", desc, body
    )


def time_chart(
    predicted: Sequence[float],
    measured: Sequence[float],
    width: float | None = None,
    *,
    as_shares: bool = False,
) -> str:
    """Predicted and measured time side by side per stage: where the cost model was wrong shows as
    uneven pairs. ``as_shares``: bars are each stage's share of its own profile's total (the two were
    timed on different devices, so only the shapes compare); bar titles still give the seconds."""
    n = max(len(predicted), len(measured), 1)
    width = width or max(300.0, min(1140.0, 16 + 150.0 * n))
    top, plot_h, bottom = 18, 150, 22
    scaled = (
        [shares(predicted), shares(measured)] if as_shares else [list(predicted), list(measured)]
    )
    peak = max([*scaled[0], *scaled[1], 1e-12])
    group = (width - 16) / n
    bar_w = min(group * 0.4, 60)
    body = [
        f'<line x1="8" x2="{_n(width - 8)}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#888"/>'
    ]
    for s in range(n):
        cx = 8 + group * (s + 0.5)
        for k, (values, kind, colour) in enumerate(
            ((predicted, "predicted", "#a0b4cc"), (measured, "measured", "#1f4e79"))
        ):
            if s >= len(values):
                continue
            value = scaled[k][s]
            h = max(value / peak * plot_h, _MIN_PX)
            x = cx - bar_w - 1 if k == 0 else cx + 1
            label = (
                f"{value:.0%} ({fmt_seconds(values[s])})" if as_shares else fmt_seconds(values[s])
            )
            share = f' data-share="{value!r}"' if as_shares else ""
            body.append(
                _rect(
                    x,
                    top + plot_h - h,
                    bar_w,
                    h,
                    colour,
                    f"stage {s} {kind}: {label}",
                    f' class="bar-{kind}" data-seconds="{values[s]!r}"{share}',
                )
            )
            if bar_w >= 44:  # room for the number; the bar's title has it either way
                body.append(
                    _text(
                        x + bar_w / 2,
                        top + plot_h - h - 3,
                        f"{value:.0%}" if as_shares else label,
                        "middle",
                        "tiny",
                    )
                )
        body.append(_text(cx, top + plot_h + 15, f"stage {s}", "middle", "small"))
    desc = "; ".join(
        f"stage {s}: predicted {fmt_seconds(predicted[s]) if s < len(predicted) else 'n/a'}, "
        f"measured {fmt_seconds(measured[s]) if s < len(measured) else 'n/a'}"
        for s in range(n)
    )
    title = (
        "Share of each stage in predicted vs measured time"
        if as_shares
        else "Predicted vs measured time per stage"
    )
    return _svg("time-chart", width, top + plot_h + bottom, title, desc, body)


def model_strip(
    stages: Sequence[Mapping[str, Any]],
    cuts: Sequence[Mapping[str, Any]],
    slowest: int | None = None,
    width: float = 1140,
) -> str:
    """The model in planned (topological) order, one block per stage sized by node count; each cut
    is a tick labelled with the bytes that cross it."""
    total = max((int(s["stop"]) for s in stages), default=0) or 1
    left, top, strip_h = 10, 40, 46
    scale = (width - 2 * left) / total
    body = []
    for s in stages:
        x, w = left + int(s["start"]) * scale, max(int(s["num_nodes"]) * scale, _MIN_PX)
        mark = (
            ' slowest" stroke="#111" stroke-width="3"'
            if s["index"] == slowest
            else '" stroke="#fff"'
        )
        body.append(
            _rect(
                x,
                top,
                w,
                strip_h,
                stage_colour(int(s["index"])),
                f"stage {s['index']}: {s['num_nodes']} nodes, {s['first_node']} → {s['last_node']}"
                + (" (slowest)" if s["index"] == slowest else ""),
                f' data-stage="{int(s["index"])}" class="stage{mark}',
            )
        )
        if w > 70:
            body.append(_text(x + w / 2, top + 20, f"stage {s['index']}", "middle", "on-colour"))
            body.append(
                _text(x + w / 2, top + 36, f"{s['num_nodes']} nodes", "middle", "on-colour small")
            )
    by_stage = {int(s["index"]): s for s in stages}
    for k, cut in enumerate(cuts):
        stage = by_stage.get(int(cut["cut"]))
        if stage is None:
            continue
        x = left + int(stage["start"]) * scale
        y = 14 if k % 2 == 0 else 28
        names = ", ".join(t["name"] for t in cut["tensors"][:8]) + (
            " …" if len(cut["tensors"]) > 8 else ""
        )
        title = f"cut {int(cut['cut']) - 1} → {cut['cut']}: {fmt_bytes(cut['bytes'])} in {len(cut['tensors'])} tensor(s): {names}"
        body.append(
            f'<g class="cut" data-cut="{int(cut["cut"])}" data-bytes="{int(cut["bytes"])}">'
            f"<title>{escape(title)}</title>"
            f'<line x1="{_n(x)}" x2="{_n(x)}" y1="{y + 3}" y2="{top + strip_h + 6}" stroke="#111" stroke-width="2"/>'
            + _text(x, y, fmt_bytes(cut["bytes"]), "middle", "small cut-label")
            + "</g>"
        )
    body.append(_text(left, top + strip_h + 20, "first node", "start", "tiny"))
    body.append(
        _text(
            width - left, top + strip_h + 20, f"last node ({total} in planned order)", "end", "tiny"
        )
    )
    desc = (
        "; ".join(f"stage {s['index']}: nodes {s['start']}–{int(s['stop']) - 1}" for s in stages)
        + ". "
        + "; ".join(f"cut before stage {c['cut']}: {fmt_bytes(c['bytes'])}" for c in cuts)
    )
    return _svg(
        "model-strip",
        width,
        top + strip_h + 26,
        "The model in planned order, coloured by stage",
        desc,
        body,
    )


def attempts_timeline(
    attempts: Sequence[Mapping[str, Any]], width: float = 1140, title: str = "Compile attempts"
) -> str:
    """One row per attempt in the order they were started; bar length is its duration
    (attempts may overlap when run in parallel, so rows share a zero rather than a clock)."""
    row_h, label_w, top = 30, 230, 6
    longest = max([float(a.get("duration_s") or 0.0) for a in attempts] + [1e-9])
    bar_max = (width - label_w - 16) * 0.3
    body = []
    for k, a in enumerate(attempts):
        y = top + k * row_h
        outcome = str(a.get("outcome"))
        duration = float(a.get("duration_s") or 0.0)
        w = max(duration / longest * bar_max, _MIN_PX)
        note = attempt_note(a, short=True)
        body.append(
            _text(4, y + 18, f"#{a.get('index', k)} {a.get('label', '')}"[:34], "start", "small")
        )
        body.append(
            _rect(
                label_w,
                y + 4,
                w,
                row_h - 10,
                OUTCOME_COLOURS.get(outcome, "#555"),
                f"attempt {a.get('index', k)}: {outcome}, {duration:.2f} s"
                + (f"; {note}" if note else ""),
                f' class="attempt outcome-{escape(outcome)}"',
            )
        )
        body.append(
            _text(
                label_w + w + 6,
                y + 18,
                f"{outcome} · {duration:.2f} s" + (f" · {note}" if note else ""),
                "start",
                "small",
            )
        )
    desc = "; ".join(
        f"attempt {a.get('index', k)} {a.get('outcome')} in {float(a.get('duration_s') or 0):.2f} s"
        for k, a in enumerate(attempts)
    )
    return _svg("attempts-timeline", width, top + row_h * len(attempts) + 4, title, desc, body)


def attempt_note(attempt: Mapping[str, Any], *, short: bool = False) -> str:
    """What an attempt taught: where it ran out of memory and the correction that followed."""
    parts = []
    oom = attempt.get("oom")
    if oom:
        where = f"device {oom['device']}" if oom.get("device") is not None else "a device"
        tile = f" tile {oom['tile']}" if oom.get("tile") is not None else ""
        used = f": {fmt_bytes(oom['bytes_used'])} used" if oom.get("bytes_used") is not None else ""
        parts.append(
            f"{where}{tile}{used}" if short else f"OOM ({oom.get('kind')}) on {where}{tile}{used}"
        )
    corr = attempt.get("correction")
    if corr:
        d = corr.get("device")
        if d is None:  # an overflow that named no device scales every device's memory
            grown = corr["scale_after"][0] / corr["scale_before"][0]
            parts.append(f"{'' if short else 'every device '}memory ×{grown:.3g}")
        else:
            before, after = corr["scale_before"][int(d)], corr["scale_after"][int(d)]
            parts.append(f"{'' if short else f'device {d} '}memory × {before:.3g} → {after:.3g}")
    return "; ".join(parts)
