"""AMP retries per stage vs global: ``sharderd shard --backend poprt`` under both ``[search]
amp_per_stage`` settings, over the truth families and device counts of ``bench/compiles.py``.

Every cell runs the global policy (``amp_per_stage = false``, the search before issue 30) first.
A cell whose global run compiled no whole model at a lowered AMP never reached an AMP retry, and
the per-stage policy differs only there, so it is listed as "same" and not run twice; the others
run the per-stage policy too. Per policy: compiles to the first success (``FAKE_POPRT_LOG``, the
probe included), the outcome, the predicted bottleneck (slowest stage time, sharderd's cost model,
which does not price AMP, so it differs only where the two searches ended on different splits)
and each stage's AMP as compiled (report.json ``plan.stages[].available_memory_proportion``).

    python bench/amp_policies.py                      # all models and truths, prints Markdown
    python bench/amp_policies.py --models cnn --truths default
    python bench/amp_policies.py --write-benchmarks   # also (re)writes its section of BENCHMARKS.md

Besides ``bench/compiles.py``'s four models, ``tiled_tail`` (``--models tiled_tail``): two
weight-heavy MatMuls on 16 rows, then a Tile to ``rows`` rows and a MatMul whose operands make
planner temporaries: the one model here whose overflow is one stage's, not the whole split's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import compiles as c  # bench/ is not a package: python puts this folder on sys.path
import onnx
from _common import machine, machine_markdown, markdown_table

from sharderd import examples

SECTION = "## AMP per stage vs global"


MODELS = (*c.MODELS, c.ModelSpec("tiled_tail", examples.tiled_tail, {"hidden": 1024, "rows": 1024}))


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One AMP policy's run of one cell: how it ended and what it lowered."""

    outcome: str
    compiles: int
    lowered: int
    """Stages whose AMP the run lowered."""
    bottleneck_s: float | None
    stage_amps: tuple[float, ...] | None


@dataclass(frozen=True, slots=True)
class Row:
    """One cell (model, truth, devices) with both policies' runs."""

    model: str
    truth: str
    devices: int
    expected: str
    glob: PolicyRun
    per_stage: PolicyRun | None
    """None: the global run made no AMP retry, so both policies search alike."""


def _run(
    model: Path, devices: int, truth: Mapping[str, Any], cell: Path, per_stage: bool
) -> PolicyRun:
    config = cell / "sharderd.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(c.CONFIG + f"\n[search]\namp_per_stage = {str(per_stage).lower()}\n")
    run = c.run_sharderd(model, devices, truth, cell, config, None)
    report_path = cell / "sharderd" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    plan = report.get("plan") if run.outcome == "compiled" else None
    amps = None
    if plan is not None:
        amps = tuple(s.get("available_memory_proportion") for s in plan["stages"])
    return PolicyRun(
        run.outcome,
        run.compiles,
        run.lower_amp,
        None if plan is None else float(plan["bottleneck_s"]),
        amps,
    )


def _retried(cell: Path, devices: int) -> bool:
    """Whether a compile of the whole model ran at a lowered AMP (global or per stage)."""
    log = c._compile_log(cell / "sharderd.compiles.jsonl")
    return any(
        r["options"]["num_ipus"] == devices
        and min([r["options"]["available_memory_proportion"], *r.get("op_amps", ())])
        < c.DEFAULT_AMP
        for r in log
    )


def run_rows(models: Sequence[c.ModelSpec], truths: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    rows = []
    for spec in models:
        path = c.build_model(spec)
        proto = onnx.load(path)
        for name, truth in truths.items():
            if not c.applies(truth, proto):
                continue
            feas = c.TruthOracle(proto, truth).feasibility()
            for devices in c.device_counts(feas):
                base = c.WORK / "amp" / f"{spec.name}-{c._slug(name)}-{devices}"
                c._clean(base / "global")
                c._clean(base / "stage")
                g = _run(path, devices, truth, base / "global", per_stage=False)
                s = None
                if _retried(base / "global", devices):
                    s = _run(path, devices, truth, base / "stage", per_stage=True)
                row = Row(spec.name, name, devices, c._expected(devices, feas), g, s)
                print(f"{spec.name} / {name} / {devices}: {g} | {s}", file=sys.stderr)
                rows.append(row)
    return rows


def _fmt(run: PolicyRun) -> str:
    mark = "✓" if run.outcome == "compiled" else f"✗ {run.outcome}"
    return f"{run.compiles} {mark}"


def _lowered(run: PolicyRun) -> str:
    if run.stage_amps is None:
        return "–"
    low = sum(1 for a in run.stage_amps if a is not None and a < c.DEFAULT_AMP)
    return f"{low}/{len(run.stage_amps)}: {', '.join(f'{a:g}' for a in run.stage_amps)}"


def _us(run: PolicyRun) -> str:
    return "–" if run.bottleneck_s is None else f"{run.bottleneck_s * 1e6:.2f}"


def table(rows: Sequence[Row]) -> str:
    body = []
    for r in rows:
        if r.per_stage is None:
            continue
        body.append(
            [
                r.model,
                r.truth,
                str(r.devices),
                r.expected,
                _fmt(r.glob),
                _fmt(r.per_stage),
                _lowered(r.glob),
                _lowered(r.per_stage),
                _us(r.glob),
                _us(r.per_stage),
            ]
        )
    head = [
        "model",
        "truth",
        "N",
        "truth says",
        "global: compiles",
        "per stage: compiles",
        "global: stages lowered, AMPs",
        "per stage: stages lowered, AMPs",
        "global bottleneck µs",
        "per stage bottleneck µs",
    ]
    return markdown_table(head, body)


def summary(rows: Sequence[Row]) -> str:
    both = [r for r in rows if r.per_stage is not None]

    def stats(runs: list[PolicyRun]) -> list[str]:
        ok = [x for x in runs if x.outcome == "compiled"]
        counts = [x.compiles for x in ok]
        low = [
            sum(1 for a in x.stage_amps or () if a is not None and a < c.DEFAULT_AMP)
            / len(x.stage_amps or (1,))
            for x in ok
        ]
        return [
            f"{len(ok)}/{len(runs)}",
            f"{statistics.median(counts):g} / {max(counts)}" if counts else "–",
            f"{100 * statistics.mean(low):.0f}%" if low else "–",
        ]

    body = [
        ["global", *stats([r.glob for r in both])],
        ["per stage", *stats([r.per_stage for r in both if r.per_stage is not None])],
    ]
    head = [
        "policy",
        "compiled",
        "compiles to success (median / max)",
        "stages at a lowered AMP (mean share, successes)",
    ]
    same = len(rows) - len(both)
    return (
        f"{len(rows)} cells; {same} made no AMP retry under the global policy (identical searches, "
        f"not rerun); {len(both)} did:\n\n" + markdown_table(head, body)
    )


def section(rows: Sequence[Row], argv: Sequence[str]) -> str:
    command = shlex.join(["python", "bench/amp_policies.py", *argv])
    return "\n".join(
        [
            SECTION,
            "",
            __doc__.split("\n\n")[0].replace("\n", " "),
            "",
            "    " + command.strip(),
            "",
            machine_markdown(machine()),
            "",
            summary(rows),
            "",
            table(rows),
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", choices=[m.name for m in MODELS])
    parser.add_argument("--truths", nargs="*", choices=list(c.TRUTHS))
    parser.add_argument("--write-benchmarks", action="store_true")
    args = parser.parse_args(argv)
    models = [m for m in MODELS if not args.models or m.name in args.models]
    truths = {k: v for k, v in c.TRUTHS.items() if not args.truths or k in args.truths}
    c.WORK.mkdir(parents=True, exist_ok=True)
    rows = run_rows(models, truths)
    shown = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-benchmarks"]
    text = section(rows, shown)
    print(text)
    if args.write_benchmarks:
        c.write_section(text, c.BENCHMARKS, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
