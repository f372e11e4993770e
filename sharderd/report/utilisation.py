"""The utilisation chart: each stage's predicted time over the slowest stage's, so the devices that
wait on the bottleneck show as short bars (a pipeline runs at the pace of its slowest stage)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sharderd.report.svg import _n, _rect, _svg, _text, stage_colour
from sharderd.units import fmt_seconds

__all__ = ["stage_utilisation", "utilisation_chart"]


def stage_utilisation(stage: Mapping[str, Any], bottleneck_s: float) -> float:
    """``utilisation`` of report.json (older reports: from the times)."""
    value = stage.get("utilisation")
    if value is None:
        value = stage["time_s"] / bottleneck_s if bottleneck_s > 0 else 1.0
    return float(value)


def utilisation_chart(stages: Sequence[Mapping[str, Any]], bottleneck_s: float) -> str:
    """A bar per stage, its height the stage's utilisation; the 100% line is the slowest stage."""
    n = max(len(stages), 1)
    width = max(300.0, min(1140.0, 16 + 90.0 * n))
    top, plot_h, bottom = 6, 40, 20
    group = (width - 16) / n
    bar_w = min(group * 0.7, 70)
    full = top
    body = [
        f'<line x1="8" x2="{_n(width - 8)}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#888"/>',
        f'<line x1="8" x2="{_n(width - 8)}" y1="{full}" y2="{full}" stroke="#222" '
        'stroke-dasharray="4 3"><title>100%: the slowest stage</title></line>',
    ]
    desc = []
    for s, stage in enumerate(stages):
        value = stage_utilisation(stage, bottleneck_s)
        h = max(value * plot_h, 1.0)
        cx = 8 + group * (s + 0.5)
        label = f"{value:.0%}"
        title = f"stage {s}: {label} of the slowest stage ({fmt_seconds(stage['time_s'])})"
        body.append(
            _rect(
                cx - bar_w / 2,
                top + plot_h - h,
                bar_w,
                h,
                stage_colour(s),
                title,
                f' class="bar-utilisation" data-utilisation="{value!r}"',
            )
        )
        body.append(_text(cx, top + plot_h + 15, f"stage {s}: {label}", "middle", "small"))
        desc.append(f"stage {s}: {label}")
    return _svg(
        "utilisation-chart",
        width,
        top + plot_h + bottom,
        "Utilisation per stage: predicted time over the slowest stage's",
        "; ".join(desc),
        body,
    )
