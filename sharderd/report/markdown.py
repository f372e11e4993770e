"""``report.md``: the facts of ``report.json`` for a person reading a terminal or a merge request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.units import fmt_bytes, fmt_flops, fmt_seconds

__all__ = ["render_markdown"]


def _stage_rows(plan: Mapping[str, Any]) -> list[str]:
    rows = [
        "| stage | nodes | first → last | FLOPs | weights | activations | code | memory / budget | time | comm |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in plan["stages"]:
        mark = " **(slowest)**" if s["index"] == plan["slowest_stage"] else ""
        rows.append(
            f"| {s['index']}{mark} | {s['num_nodes']} | `{s['first_node']}` → `{s['last_node']}` "
            f"| {fmt_flops(s['flops'])} | {fmt_bytes(s['weight_bytes'])} | {fmt_bytes(s['activation_bytes'])} "
            f"| {fmt_bytes(s['code_bytes'])} | {fmt_bytes(s['memory_bytes'])} / {fmt_bytes(s['budget_bytes'])} "
            f"({100 * s['memory_bytes'] / s['capacity_bytes']:.0f}% of device) "
            f"| {fmt_seconds(s['time_s'])} | {fmt_seconds(s['comm_s'])} |"
        )
    return rows


def _balance(times: list[float]) -> str:
    return f"{max(times) / (sum(times) / len(times)):.2f}" if times and sum(times) > 0 else "-"


def render_markdown(report: Mapping[str, Any]) -> str:
    model, target, plan = report["model"], report["target"], report["plan"]
    lines = [
        f"# sharderd report: {model['name']}",
        "",
        f"- status: **{report['status']}** (backend `{report['backend']}`)",
        f"- model: {model['nodes']} nodes, {fmt_flops(model['flops'])} per batch of {report['batch_size']}, "
        f"weights {fmt_bytes(model['weight_bytes'])}"
        + (f" ({fmt_bytes(model['external_bytes'])} external)" if model["external_bytes"] else "")
        + f", sha256 `{model['sha256'][:16]}…`",
        f"- target: `{target['name']}`: {fmt_bytes(target['memory_bytes'])} per device, "
        f"{target['flops_per_s'] / 1e12:.1f} TFLOP/s peak × {target['efficiency']:g} efficiency, "
        f"links {target['link_bytes_per_s'] / 1e9:.0f} GB/s",
    ]
    if model["renamed_nodes"]:
        lines.append(f"- renamed {model['renamed_nodes']} node(s) to `<OpType>_<k>` (--name-nodes)")
    if plan is not None:
        lines += [
            "",
            f"## Plan: {plan['devices']} stage(s), one device each",
            "",
            f"- slowest stage: {plan['slowest_stage']}, {fmt_seconds(plan['bottleneck_s'])} per batch "
            f"(lower bound {fmt_seconds(plan['lower_bound_s'])}, ratio {plan['ratio_to_bound']:.3f})",
            f"- predicted throughput: {plan['predicted_throughput_per_s']:.1f} samples/s"
            if plan["predicted_throughput_per_s"]
            else "- predicted throughput: n/a",
            f"- order `{plan['order']}` (tried: "
            + ", ".join(
                f"{name} {fmt_seconds(v) if v is not None else 'no fit'}" for name, v in plan["orders_tried"].items()
            )
            + f"); safety margin {plan['safety_margin']:g}; plan digest `{plan['digest']}`",
            "",
            *_stage_rows(plan),
        ]
        if plan["cuts"]:
            lines += ["", "### Cuts", ""]
            for cut in plan["cuts"]:
                names = ", ".join(f"`{t['name']}` ({fmt_bytes(t['bytes'])})" for t in cut["tensors"][:6])
                more = f" and {len(cut['tensors']) - 6} more" if len(cut["tensors"]) > 6 else ""
                lines.append(f"- stage {cut['cut'] - 1} → {cut['cut']}: {fmt_bytes(cut['bytes'])}: {names}{more}")
        if plan["routed_inputs"]:
            lines += ["", "### Graph inputs routed through an Identity (PopART streams an input to one IPU)", ""]
            for r in plan["routed_inputs"]:
                lines.append(f"- `{r['input']}` read on stages {r['stages']}: `{r['node']}` on stage {r['stages'][0]}")
    if report["attempts"]:
        lines += ["", "## Compile attempts", "", "| # | outcome | duration | options | detail |", "|---|---|---|---|---|"]
        for k, a in enumerate(report["attempts"]):
            lines.append(
                f"| {k} | {a.get('outcome')} | {a.get('duration_s', 0):.1f} s | {a.get('label', '')} | "
                f"{(a.get('message') or '').splitlines()[0][:120] if a.get('message') else ''} |"
            )
    timed = [a for a in report["attempts"] if (a.get("details") or {}).get("stage_times_s")]
    if timed:
        lines += [
            "",
            "## Predicted vs measured stage times",
            "",
            "Balance = slowest / mean stage: 1.00 is a perfect pipeline. Predictions use the target's cost",
            "model (or measured node times with `cost_model = \"measured\"`); measurements are the backend's.",
            "",
            "| attempt | cost model | predicted per stage | balance | measured per stage | balance | throughput |",
            "|---|---|---|---|---|---|---|",
        ]
        for a in timed:
            predicted = a.get("predicted_stage_times_s") or []
            measured = a["details"]["stage_times_s"]
            bench = a.get("benchmark") or {}
            lines.append(
                f"| {a['index']} | {a.get('cost_model', 'analytic')} | {', '.join(fmt_seconds(x) for x in predicted)} "
                f"| {_balance(predicted)} | {', '.join(fmt_seconds(x) for x in measured)} | {_balance(measured)} "
                f"| {bench.get('throughput_per_s', 0):.1f}/s |"
            )
    if report.get("verification"):
        v = report["verification"]
        lines += ["", f"## Verification: {'passed' if v.get('passed') else 'FAILED'} (rtol {v.get('rtol')}, atol {v.get('atol')})", ""]
        lines += ["| output | max abs error | max rel error | result |", "|---|---|---|---|"]
        for name, o in (v.get("outputs") or {}).items():
            lines.append(
                f"| `{name}` | {o.get('max_abs', 0):.3g} | {o.get('max_rel', 0):.3g} | {'ok' if o.get('passed') else 'MISMATCH'} |"
            )
    if report.get("error"):
        err = report["error"]
        lines += ["", "## Error", "", err.get("message", ""), ""]
        if err.get("hint"):
            lines.append(f"What to do: {err['hint']}")
    if report["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    if report["outputs"]:
        lines += ["", "## Files", ""] + [f"- {k}: `{v}`" for k, v in report["outputs"].items() if v]
    return "\n".join(lines) + "\n"
