"""The header's fact list: model, target, backend, the plan's headline numbers, what was measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.report.build import nodes_phrase
from sharderd.report.html.markup import esc
from sharderd.report.measured import measurement
from sharderd.units import fmt_bytes, fmt_flops, fmt_seconds

__all__ = ["facts_list"]


def _held_facts(plan: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """What holds the bottleneck, and the fewest devices for this throughput (older reports: none)."""
    facts = []
    held = plan.get("bottleneck_held_by")
    if held:
        facts.append(("held-by", "held by", esc(held["description"])))
    fewest, devices = plan.get("fewest_devices"), plan["devices"]
    if plan.get("max_devices") is not None:
        facts.append(
            (
                "fewest-devices",
                "devices auto",
                f"{esc(devices)} of at most {esc(plan['max_devices'])}: the fewest whose predicted "
                f"throughput is within {plan['fewest_devices_band']:.0%} of a plan on "
                f"{esc(plan['max_devices'])}",
            )
        )
    elif fewest is not None and fewest < devices:
        facts.append(
            (
                "fewest-devices",
                "fewest devices",
                f"{esc(fewest)} give the same predicted throughput (within "
                f"{plan['fewest_devices_band']:.0%}); the other {esc(devices - fewest)} add nothing "
                "to it under the cost model",
            )
        )
    return facts


def facts_list(report: Mapping[str, Any]) -> str:
    model, target, plan = report["model"], report["target"], report.get("plan")
    facts: list[tuple[str, str, str]] = [
        (
            "model",
            "model",
            f"<code>{esc(model['name'])}</code>: {esc(nodes_phrase(model))}, {esc(fmt_flops(model['flops']))}, "
            f"weights {esc(fmt_bytes(model['weight_bytes']))}",
        ),
        (
            "target",
            "target",
            f"<code>{esc(target['name'])}</code>: {esc(fmt_bytes(target['memory_bytes']))} per device",
        ),
        ("backend", "backend", f"<code>{esc(report['backend'])}</code>"),
    ]
    if plan is not None:
        ratio = plan["ratio_to_bound"]
        tput = plan.get("predicted_throughput_per_s")
        facts += [
            ("devices", "devices", esc(plan["devices"])),
            (
                "bottleneck",
                "bottleneck",
                f"stage {esc(plan['slowest_stage'])}, {esc(fmt_seconds(plan['bottleneck_s']))} per batch",
            ),
            (
                "bound",
                "lower bound",
                f"{esc(fmt_seconds(plan['lower_bound_s']))} (ratio {ratio:.3f})",
            ),
            *(
                [
                    (
                        "split",
                        "split",
                        f"<code>{esc(plan['method'])}</code>"
                        + (", proven optimal" if plan.get("proven_optimal") else "")
                        + f": {esc(plan['claim'])}",
                    )
                ]
                if plan.get("claim")
                else []
            ),
            *_held_facts(plan),
            (
                "throughput",
                "predicted throughput",
                f"{tput:.1f} samples/s (batch {esc(report['batch_size'])}) on <code>{esc(target['name'])}</code>, "
                "cost model"
                if tput
                else "n/a",
            ),
        ]
    bench = report.get("benchmark")
    if bench:
        where = measurement(report)
        note = (
            ""
            if where.same_device
            else "; a different device from the prediction's: the numbers do not compare"
        )
        facts.append(
            (
                "measured",
                "measured throughput",
                f"{bench['throughput_per_s']:.1f} samples/s with {esc(where.where)}{esc(note)}",
            )
        )
    if report.get("verification"):
        ok = report["verification"].get("passed")
        facts.append(
            (
                "verification",
                "verification",
                '<span class="ok">passed</span>' if ok else '<span class="bad">FAILED</span>',
            )
        )
    return (
        '<dl class="facts">'
        + "".join(
            f'<div data-fact="{key}"><dt>{esc(label)}</dt><dd>{html}</dd></div>'
            for key, label, html in facts
        )
        + "</dl>"
    )
