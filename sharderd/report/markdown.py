"""``report.md``: the facts of ``report.json`` for a person reading a terminal or a merge request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharderd.plan.serialize_choice import BOTTLENECK_GAIN
from sharderd.report.attempts import attempts_heading
from sharderd.report.build import nodes_phrase
from sharderd.report.measured import measurement, shares
from sharderd.units import fmt_bytes, fmt_flops, fmt_seconds

__all__ = ["TERMS_NOTE", "TIME_TERMS", "has_terms", "render_markdown"]


TIME_TERMS = (
    ("flops_s", "compute"),
    ("overhead_s", "per-node overhead"),
    ("host_s", "host I/O"),
    ("comm_in_s", "comm in"),
    ("comm_out_s", "comm out"),
)
"""The terms of a stage's predicted time (``StageCost``), in the order they sum to ``time_s``."""
TERMS_NOTE = (
    "A stage's time is the sum of its terms: compute (FLOPs at the target's effective rate, or "
    'measured node times with `cost_model = "measured"`, which include the per-node overhead), '
    "a fixed overhead per compiled op by op type (the target's `op_overhead_s_table`; folded nodes and "
    "views none), graph inputs and outputs over the host link, and the tensors received "
    "from and sent to the neighbouring stages."
)


def has_terms(stage: Mapping[str, Any]) -> bool:
    """Reports older than the split of ``compute_s`` have only ``compute_s`` and ``comm_s``."""
    return all(key in stage for key, _ in TIME_TERMS)


def _stage_rows(plan: Mapping[str, Any]) -> list[str]:
    terms = all(has_terms(s) for s in plan["stages"])
    time_head = " | ".join(label for _, label in TIME_TERMS) if terms else "comm"
    rows = [
        f"| stage | nodes | first → last | FLOPs | weights | activations | code | memory / budget | time | utilisation | {time_head} |",
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * (len(TIME_TERMS) if terms else 1),
    ]
    for s in plan["stages"]:
        mark = " **(slowest)**" if s["index"] == plan["slowest_stage"] else ""
        cells = (
            " | ".join(fmt_seconds(s[key]) for key, _ in TIME_TERMS)
            if terms
            else fmt_seconds(s["comm_s"])
        )
        rows.append(
            f"| {s['index']}{mark} | {s['num_nodes']} | `{s['first_node']}` → `{s['last_node']}` "
            f"| {fmt_flops(s['flops'])} | {fmt_bytes(s['weight_bytes'])} | {fmt_bytes(s['activation_bytes'])} "
            f"| {fmt_bytes(s['code_bytes'])} | {fmt_bytes(s['memory_bytes'])} / {fmt_bytes(s['budget_bytes'])} "
            f"({100 * s['memory_bytes'] / s['capacity_bytes']:.0f}% of device) "
            f"| {fmt_seconds(s['time_s'])} | {_utilisation(s, plan)} | {cells} |"
        )
    if terms:
        rows += ["", TERMS_NOTE]
    return rows


def _utilisation(stage: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
    """Stage time over the bottleneck (older reports: computed from the times)."""
    value = stage.get("utilisation")
    if value is None:
        value = stage["time_s"] / plan["bottleneck_s"] if plan["bottleneck_s"] else 1.0
    return f"{value:.0%}"


def _held_lines(plan: Mapping[str, Any]) -> list[str]:
    """What holds the bottleneck, and the fewest devices for this throughput (older reports: none)."""
    lines = []
    held = plan.get("bottleneck_held_by")
    if held:
        lines.append(f"- the slowest stage is held by {held['description']}")
    fewest, devices = plan.get("fewest_devices"), plan["devices"]
    if plan.get("max_devices") is not None:
        lines.append(
            f"- `--devices auto`: {devices} device(s), the fewest of at most {plan['max_devices']} "
            f"whose predicted throughput is within {plan['fewest_devices_band']:.0%} of a plan on "
            f"{plan['max_devices']}"
        )
    elif fewest is not None and fewest < devices:
        lines.append(
            f"- {fewest} device(s) give the same predicted throughput (within "
            f"{plan['fewest_devices_band']:.0%}: {fmt_seconds(plan['fewest_devices_bottleneck_s'])} "
            f"per batch): the other {devices - fewest} add nothing to it under the cost model"
        )
    return lines


def _amp_lines(plan: Mapping[str, Any]) -> list[str]:
    """Each stage's ``available_memory_proportion`` (PopRT compiles only; older reports: none)."""
    amps = [s.get("available_memory_proportion") for s in plan["stages"]]
    if not amps or any(a is None for a in amps):
        return []
    return [
        "- available_memory_proportion per stage (the cap on conv/matmul temporaries per tile): "
        + ", ".join(f"stage {i}: {a:g}" for i, a in enumerate(amps))
    ]


def _serial_lines(plan: Mapping[str, Any]) -> list[str]:
    """The MatMuls PopART computes in pieces (older reports: none)."""
    pieces = plan.get("matmul_serialization") or []
    if not pieces:
        return []
    return [
        "- matmul serialization (PopART computes the op in pieces, one after the other, on its "
        "device; the node ran out of memory alone without it): "
        + ", ".join(f"`{p['node']}` {p['mode']} ×{p['factor']}" for p in pieces)
    ]


def _balance(times: list[float]) -> str:
    return f"{max(times) / (sum(times) / len(times)):.2f}" if times and sum(times) > 0 else "-"


def _timed_rows(report: Mapping[str, Any], a: Mapping[str, Any]) -> list[str]:
    """One attempt's predicted and measured stage times: absolute on the same device, else shares."""
    predicted = list(a.get("predicted_stage_times_s") or [])
    measured = list(a["details"]["stage_times_s"])
    bench = a.get("benchmark") or {}
    where = measurement(report, a)
    lines = [
        f"Attempt {a['index']} ({a.get('cost_model', 'analytic')} cost model): predicted for "
        f"`{report['target']['name']}`, measured with {where.where}. Balance = slowest / mean stage: "
        "1.00 is a perfect pipeline.",
        "",
    ]
    if where.same_device:
        lines += [
            "| | per stage | balance | throughput |",
            "|---|---|---|---|",
            f"| predicted | {', '.join(fmt_seconds(x) for x in predicted)} | {_balance(predicted)} | |",
            f"| measured | {', '.join(fmt_seconds(x) for x in measured)} | {_balance(measured)} "
            f"| {bench.get('throughput_per_s', 0):.1f}/s |",
        ]
    else:
        lines += [
            "Different devices, so the absolute times do not compare; the shapes do: each stage's share "
            "of its profile's total.",
            "",
            "| | share per stage | balance | time per stage |",
            "|---|---|---|---|",
            f"| predicted ({report['target']['name']}) | {', '.join(f'{x:.0%}' for x in shares(predicted))} "
            f"| {_balance(predicted)} | {', '.join(fmt_seconds(x) for x in predicted)} |",
            f"| measured ({where.where}) | {', '.join(f'{x:.0%}' for x in shares(measured))} "
            f"| {_balance(measured)} | {', '.join(fmt_seconds(x) for x in measured)} |",
        ]
    return [*lines, ""]


def _why_serialized(s: Mapping[str, Any]) -> str:
    """The reason of a ``serialized`` entry in words (older reports have no ``reason``)."""
    if s.get("reason") != "bottleneck":
        return "too big for one device"
    before, after = s["bottleneck_before_s"], s["bottleneck_after_s"]
    return (
        f"its own time held the bottleneck up: predicted {fmt_seconds(before)} whole, "
        f"{fmt_seconds(after)} in pieces"
    )


def _trial_words(t: Mapping[str, Any]) -> str:
    """A bottleneck rewrite that was priced and not kept, in words."""
    cut = ", ".join(f"`{n['node']}` into {n['pieces']}" for n in t["nodes"])
    after = t["bottleneck_after_s"]
    if not t.get("after_planned", True):
        floor = fmt_seconds(t["after_lower_bound_s"])
        priced = f"at least {floor} in pieces (no split beats that floor, so none was planned)"
    elif after is None:
        priced = "no split in pieces fits"
    else:
        priced = f"{fmt_seconds(after)} predicted in pieces"
    return (
        f"not serialized: cutting {cut} for the bottleneck was priced: {priced}, against "
        f"{fmt_seconds(t['bottleneck_before_s'])} whole (kept only when more than "
        f"{BOTTLENECK_GAIN:.0%} lower)"
    )


_STATUS_MEANS = {
    "compiled": "; PopRT compiled the sharded model",
    "verified": "; onnxruntime built and ran the stage sessions and checked their outputs against "
    "the model: nothing was compiled",
    "not_compiled": "; planned and written, proven by no backend",
}
"""What a success status means, said where a person reads it."""


def render_markdown(report: Mapping[str, Any]) -> str:
    model, target, plan = report["model"], report["target"], report["plan"]
    lines = [
        f"# sharderd report: {model['name']}",
        "",
        f"- status: **{report['status']}** (backend `{report['backend']}`)"
        + _STATUS_MEANS.get(report["status"], ""),
        f"- model: {nodes_phrase(model)}, {fmt_flops(model['flops'])} per batch of {report['batch_size']}, "
        f"weights {fmt_bytes(model['weight_bytes'])}"
        + (f" ({fmt_bytes(model['external_bytes'])} external)" if model["external_bytes"] else "")
        + f", sha256 `{model['sha256'][:16]}…`",
        f"- target: `{target['name']}`: {fmt_bytes(target['memory_bytes'])} per device, "
        f"{target['flops_per_s'] / 1e12:.1f} TFLOP/s peak × {target['efficiency']:g} efficiency, "
        f"links {target['link_bytes_per_s'] / 1e9:.0f} GB/s",
    ]
    if model["renamed_nodes"]:
        lines.append(f"- renamed {model['renamed_nodes']} node(s) to `<OpType>_<k>` (--name-nodes)")
    for s in report.get("serialized") or ():
        lines.append(
            f"- serialized `{s['node']}` ({s['op']}, {_why_serialized(s)}) into {s['pieces']} "
            f"pieces by {s['kind']}, on stages {sorted(set(x for x in s['stages'] if x is not None))}"
        )
    for t in report.get("serialization_tried") or ():
        if not t["kept"]:
            lines.append(f"- {_trial_words(t)}")
    if plan is not None:
        lines += [
            "",
            f"## Plan: {plan['devices']} stage(s), one device each",
            "",
            f"- slowest stage: {plan['slowest_stage']}, {fmt_seconds(plan['bottleneck_s'])} per batch "
            f"(lower bound {fmt_seconds(plan['lower_bound_s'])}, ratio {plan['ratio_to_bound']:.3f})",
            f"- predicted throughput: {plan['predicted_throughput_per_s']:.1f} samples/s on `{target['name']}` (cost model)"
            + (
                f"; measured {report['benchmark']['throughput_per_s']:.1f} samples/s with {measurement(report).where}"
                + (
                    ""
                    if measurement(report).same_device
                    else ", a different device: the two numbers do not compare"
                )
                if (report.get("benchmark") or {}).get("throughput_per_s")
                else ""
            )
            if plan["predicted_throughput_per_s"]
            else "- predicted throughput: n/a",
            f"- order `{plan['order']}` (tried: "
            + ", ".join(
                f"{name} {fmt_seconds(v) if v is not None else 'no fit'}"
                for name, v in plan["orders_tried"].items()
            )
            + f"); safety margin {plan['safety_margin']:g}; plan digest `{plan['digest']}`",
            *_held_lines(plan),
            *_amp_lines(plan),
            *_serial_lines(plan),
            *(
                [
                    f"- split by `{plan['method']}`"
                    + (", proven optimal" if plan.get("proven_optimal") else "")
                    + f": {plan['claim']}"
                ]
                if plan.get("claim")
                else []
            ),
            "",
            *_stage_rows(plan),
        ]
        if plan["cuts"]:
            lines += ["", "### Cuts", ""]
            for cut in plan["cuts"]:
                names = ", ".join(
                    f"`{t['name']}` ({fmt_bytes(t['bytes'])})" for t in cut["tensors"][:6]
                )
                more = f" and {len(cut['tensors']) - 6} more" if len(cut["tensors"]) > 6 else ""
                lines.append(
                    f"- stage {cut['cut'] - 1} → {cut['cut']}: {fmt_bytes(cut['bytes'])}: {names}{more}"
                )
        if plan["routed_inputs"]:
            lines += [
                "",
                "### Graph inputs routed through an Identity (PopART streams an input to one IPU)",
                "",
            ]
            for r in plan["routed_inputs"]:
                lines.append(
                    f"- `{r['input']}` read on stages {r['stages']}: `{r['node']}` on stage {r['stages'][0]}"
                )
    if report["attempts"]:
        lines += [
            "",
            f"## {attempts_heading(str(report['backend']))}",
            "",
            "| # | outcome | duration | options | detail |",
            "|---|---|---|---|---|",
        ]
        for k, a in enumerate(report["attempts"]):
            lines.append(
                f"| {k} | {a.get('outcome')} | {a.get('duration_s', 0):.1f} s | {a.get('label', '')} | "
                f"{(a.get('message') or '').splitlines()[0][:120] if a.get('message') else ''} |"
            )
    timed = [a for a in report["attempts"] if (a.get("details") or {}).get("stage_times_s")]
    if timed:
        lines += ["", "## Predicted vs measured stage times", ""]
        for a in timed:
            lines += _timed_rows(report, a)
    if report.get("verification"):
        v = report["verification"]
        lines += [
            "",
            f"## Verification: {'passed' if v.get('passed') else 'FAILED'} (rtol {v.get('rtol')}, atol {v.get('atol')})",
            "",
        ]
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
