"""Predicted vs measured stage balance of the onnxruntime backend, before and after re-planning.

Balance is slowest / mean of the measured stage times (1.00 = a perfect pipeline); each stage is
timed alone, one intra-op thread per stage on this 2-core machine, so other load shows as noise,
and every cell is repeated.

Two parts:

- CLI (default): ``sharderd shard MODEL -n N --backend onnxruntime`` with ``[target] name = "cpu"``
  and ``[plan] cost_model`` = ``analytic`` then ``measured``, each in a fresh process. *Before* is
  the analytic run's only attempt; *after* is the measured run's re-plan (attempt 1), planned on
  the node times attempt 0 profiled.
- ``--schemes``: the same loop in-process (engine ``make_plan`` + backend ``run_attempt``, as the
  CLI's prover calls them), once per profiling scheme, because the scheme is a backend option
  the CLI config does not expose. *off, raw*: profile with optimizations off, measure at all
  (what the backend did before). *scaled*: each stage's node times multiplied to sum to its
  measured time (the profiler slows small kernels). *basic*: profile and measure at basic, which
  keeps most node names. *all*: profile and measure at all, each fused or NCHWc node's time
  attributed back to the original nodes it replaced (the default).

    python bench/ort_balance.py --repeat 3             # CLI table
    python bench/ort_balance.py --schemes --repeat 3   # scheme tables
    python bench/ort_balance.py --quick                # cnn and shared_weights, 3 devices, 1 repeat
    python bench/ort_balance.py [--schemes] --render   # the tables again from bench/out JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (  # bench/ is not a package: python puts this folder on sys.path
    OUT,
    machine,
    machine_markdown,
    markdown_table,
    run_measured,
    sharderd_exe,
    write_json,
)

from sharderd.backends.onnxruntime import run_attempt
from sharderd.backends.protocol import AttemptRequest
from sharderd.config import OrtConfig, PlanConfig
from sharderd.engine import analyze_file, make_plan, write_shard_files
from sharderd.graph.analyze import Analysis
from sharderd.plan.types import Plan
from sharderd.target import BUILTIN_TARGETS

HERE = OUT / "ort_balance"


@dataclass(frozen=True, slots=True)
class Model:
    kind: str
    settings: Mapping[str, int]

    @property
    def label(self) -> str:
        return f"{self.kind} ({', '.join(f'{k}={v}' for k, v in self.settings.items())})"

    def path(self) -> Path:
        path = HERE / "models" / f"{self.kind}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            sets = [arg for k, v in self.settings.items() for arg in ("--set", f"{k}={v}")]
            run = run_measured(
                [sharderd_exe(), "example-model", self.kind, *sets, "--out", str(path)]
            )
            if run.exit_code:
                raise SystemExit(f"example-model {self.kind} failed: {run.stderr}")
        return path


MODELS = (
    Model("transformer", {"layers": 6, "hidden": 128, "seq": 64}),
    Model("cnn", {"blocks": 8, "image": 96}),
    Model("shared_weights", {"layers": 6, "hidden": 512, "batch": 16}),
    Model("chain", {"nodes": 200, "hidden": 256, "batch": 16}),
)
SCHEMES: Mapping[str, Mapping[str, str | bool]] = {
    "off, raw (before)": {"profile_optimization": "off", "profile_scale": False},
    "off, scaled": {"profile_optimization": "off"},
    "all, raw": {"profile_scale": False},
    "basic": {"graph_optimization": "basic"},
    "all (default)": {},
}
"""Backend options per scheme; unnamed ones keep the defaults (measure and profile at ``all``,
node times scaled per stage to the measured stage time)."""


def balance(times: Sequence[float]) -> float:
    return max(times) / (sum(times) / len(times)) if times and sum(times) > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class Measured:
    """One attempt: the plan's per-stage prediction and what the backend measured."""

    predicted: tuple[float, ...]
    measured: tuple[float, ...]
    throughput: float
    digest: str

    def json(self) -> dict[str, Any]:
        return {
            "predicted": list(self.predicted),
            "measured": list(self.measured),
            "throughput": self.throughput,
            "digest": self.digest,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Measured:
        return cls(
            tuple(data["predicted"]), tuple(data["measured"]), data["throughput"], data["digest"]
        )


# --- CLI ------------------------------------------------------------------------------------------


def cli_run(model: Model, devices: int, cost_model: str) -> tuple[Measured, Measured | None]:
    """(first attempt, re-plan on measured times or None) of one ``sharderd shard`` run."""
    with tempfile.TemporaryDirectory(prefix="ort-balance-") as folder:
        config = Path(folder) / "sharderd.toml"
        config.write_text(f'[plan]\ncost_model = "{cost_model}"\n\n[target]\nname = "cpu"\n')
        out = Path(folder) / "out"
        argv = [sharderd_exe(), "shard", str(model.path()), "-n", str(devices)]
        argv += ["--backend", "onnxruntime", "--config", str(config), "--out", str(out), "--quiet"]
        run = run_measured(argv)
        if run.exit_code:
            raise SystemExit(f"{' '.join(argv)} failed ({run.exit_code}): {run.stderr[-2000:]}")
        attempts = json.loads((out / "report.json").read_text())["attempts"]
    ok = [a for a in attempts if a.get("outcome") == "ok"]
    replans = [_from_report(a) for a in ok if a.get("cost_model") == "measured"]
    return _from_report(ok[0]), (replans[0] if replans else None)


def _from_report(attempt: Mapping[str, Any]) -> Measured:
    return Measured(
        predicted=tuple(attempt["predicted_stage_times_s"]),
        measured=tuple(attempt["details"]["stage_times_s"]),
        throughput=float(attempt["benchmark"]["throughput_per_s"]),
        digest=attempt["plan_digest"],
    )


def run_cli(models: Sequence[Model], devices: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """Per cell: the analytic runs, and each measured run's re-plan (or its first attempt when
    the re-plan gave the analytic split back, which the prover does not compile again)."""
    cells = []
    for model in models:
        for n in devices:
            cell: dict[str, Any] = {"model": model.kind, "devices": n, "before": [], "after": []}
            cell["replanned"] = []
            for _ in range(repeat):
                cell["before"].append(cli_run(model, n, "analytic")[0].json())
                first, replan = cli_run(model, n, "measured")
                cell["after"].append((replan or first).json())
                cell["replanned"].append(replan is not None)
            cells.append(cell)
            print(render_cli([cell]), flush=True)
    return cells


CLI_HEADER = (
    "model",
    "devices",
    "cost model",
    "predicted per stage",
    "predicted balance",
    "measured per stage (median)",
    "measured balance, median [min–max]",
    "throughput /s, median [min–max]",
)


def render_cli(cells: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for cell in cells:
        before = [Measured.of(m) for m in cell["before"]]
        after = [Measured.of(m) for m in cell["after"]]
        planned = [m for m, again in zip(after, cell["replanned"], strict=True) if again]
        same = len(after) - len(planned)
        note = f" (re-plan = analytic split in {same}/{len(after)})" if same else ""
        rows.append([cell["model"], cell["devices"], "analytic", *_cells(before)])
        rows.append(["", "", f"measured{note}", *_cells(after, planned)])
    return markdown_table(CLI_HEADER, rows)


def _cells(runs: Sequence[Measured], planned: Sequence[Measured] | None = None) -> list[str]:
    """Per-stage medians over the repeats that share the split shown; balances over all repeats.

    ``planned``: the runs whose prediction to show; empty when none was re-planned.
    """
    digests = {m.digest for m in runs}
    chosen = (runs if planned is None else planned or runs)[-1]
    pick = [m for m in runs if m.digest == chosen.digest]
    predicted = chosen.predicted
    measured = [statistics.median(m.measured[s] for m in pick) for s in range(len(predicted))]
    splits = "" if len(digests) == 1 else f" ({len(digests)} splits)"
    same = planned is not None and not planned
    return [
        "analytic split" if same else _us(predicted),
        "" if same else f"{balance(predicted):.2f}",
        _us(measured) + splits,
        _spread([balance(m.measured) for m in runs], "{:.2f}"),
        _spread([m.throughput for m in runs], "{:.0f}"),
    ]


def _us(times: Sequence[float]) -> str:
    return ", ".join(f"{t * 1e6:.0f}" for t in times) + " µs"


def _spread(values: Sequence[float], fmt: str) -> str:
    return (
        f"{fmt.format(statistics.median(values))} "
        f"[{fmt.format(min(values))}–{fmt.format(max(values))}]"
    )


# --- profiling schemes, in-process ----------------------------------------------------------------


def scheme_run(model: Model, devices: int, scheme: str, work: Path) -> Measured:
    """The re-plan on the analytic plan's profiled node times, measured, as the CLI does it."""
    config, target, ort = PlanConfig(), BUILTIN_TARGETS["cpu"], OrtConfig()
    analysis = analyze_file(model.path(), config)
    first_plan = make_plan(analysis, target, devices, config)
    _, times = _attempt(analysis, first_plan, work / "first", devices, scheme, ort, profile=True)
    second_plan = make_plan(analysis, target, devices, config, measured_times=times)
    return _attempt(analysis, second_plan, work / "second", devices, scheme, ort, profile=False)[0]


def _attempt(
    analysis: Analysis,
    plan: Plan,
    folder: Path,
    devices: int,
    scheme: str,
    ort: OrtConfig,
    *,
    profile: bool,
) -> tuple[Measured, dict[str, float]]:
    shutil.rmtree(folder, ignore_errors=True)
    files = write_shard_files(analysis, plan, folder, "model")
    request = AttemptRequest(
        backend="onnxruntime",
        model=str(files.model),
        artifact=str(folder / "artifact"),
        num_devices=devices,
        options={"measure": True, "profile": profile, **SCHEMES[scheme]},
        warmup=ort.warmup,
        runs=ort.runs,
    )
    outcome = run_attempt(request)
    if outcome.outcome != "ok" or outcome.benchmark is None or outcome.details is None:
        raise SystemExit(f"attempt failed: {outcome.message}")
    measured = Measured(
        predicted=tuple(s.time_s for s in plan.stages),
        measured=tuple(outcome.benchmark.stage_times_s),
        throughput=outcome.benchmark.throughput_per_s,
        digest=plan.digest,
    )
    return measured, dict(outcome.details.get("node_times_s", {}))


def run_schemes(
    models: Sequence[Model], devices: Sequence[int], repeat: int
) -> list[dict[str, Any]]:
    """Repeats interleave the schemes, so a burst of load on the machine hits them all alike."""
    cells = []
    with tempfile.TemporaryDirectory(prefix="ort-schemes-") as folder:
        for model in models:
            for n in devices:
                runs: dict[str, list[Any]] = {scheme: [] for scheme in SCHEMES}
                for _ in range(repeat):
                    for scheme in SCHEMES:
                        runs[scheme].append(scheme_run(model, n, scheme, Path(folder)).json())
                cells.append({"model": model.kind, "devices": n, "runs": runs})
                print(render_schemes(cells[-1:])[0], flush=True)
    return cells


SCHEME_HEADER = (
    "model",
    "devices",
    "scheme",
    "re-planned: predicted per stage",
    "predicted balance",
    "measured per stage (median)",
    "measured balance, median [min–max]",
    "predicted / measured slowest",
    "slowest stage vs before",
    "throughput /s, median [min–max]",
)
TOTALS_HEADER = (
    "scheme",
    "measured balance, geometric mean",
    "median",
    "worst",
    "predicted / measured slowest, geometric mean",
    "slowest stage vs before, geometric mean",
)


def render_schemes(cells: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(every cell and scheme, measured balance per cell by scheme, totals by scheme)."""
    rows, matrix = [], []
    totals: dict[str, dict[str, list[float]]] = {
        s: {"balance": [], "error": [], "slowest": []} for s in SCHEMES
    }
    for cell in cells:
        runs = {s: [Measured.of(m) for m in cell["runs"][s]] for s in SCHEMES}
        before = statistics.median(max(m.measured) for m in runs[next(iter(SCHEMES))])
        line = [cell["model"], cell["devices"]]
        for scheme, found in runs.items():
            errors = [max(m.predicted) / max(m.measured) for m in found]
            slowest = statistics.median(max(m.measured) for m in found) / before
            balances = [balance(m.measured) for m in found]
            totals[scheme]["balance"] += balances
            totals[scheme]["error"] += errors
            totals[scheme]["slowest"].append(slowest)
            cells_ = _cells(found)
            rows.append(
                [
                    cell["model"],
                    cell["devices"],
                    scheme,
                    *cells_[:4],
                    _spread(errors, "{:.2f}"),
                    f"{slowest:.2f}",
                    cells_[4],
                ]
            )
            line.append(f"{statistics.median(balances):.2f} ({statistics.median(errors):.2f})")
        matrix.append(line)
    total_rows = [
        [
            scheme,
            f"{statistics.geometric_mean(v['balance']):.3f}",
            f"{statistics.median(v['balance']):.2f}",
            f"{max(v['balance']):.2f}",
            f"{statistics.geometric_mean(v['error']):.2f}",
            f"{statistics.geometric_mean(v['slowest']):.2f}",
        ]
        for scheme, v in totals.items()
    ]
    return (
        markdown_table(SCHEME_HEADER, rows),
        markdown_table(("model", "devices", *SCHEMES), matrix),
        markdown_table(TOTALS_HEADER, total_rows),
    )


# --- main -----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", action="store_true", help="compare profiling schemes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", type=int, nargs="*", default=[2, 3, 4])
    parser.add_argument("--models", nargs="*", choices=[m.kind for m in MODELS])
    parser.add_argument("--quick", action="store_true", help="cnn and shared_weights, 3 devices")
    parser.add_argument("--render", action="store_true", help="print the tables of the last run")
    args = parser.parse_args(argv)
    path = HERE / ("schemes.json" if args.schemes else "cli.json")
    if args.render:
        saved = json.loads(path.read_text())
        info, cells = saved["machine"], saved["cells"]
    else:
        models = [m for m in MODELS if args.models is None or m.kind in args.models]
        devices, repeat = args.devices, args.repeat
        if args.quick:
            models = [m for m in MODELS if m.kind in ("cnn", "shared_weights")]
            devices, repeat = [3], 1
        info = machine()
        info["loadavg_start"] = os.getloadavg()
        info["models"] = [m.label for m in models]
        info["repeat"] = repeat
        cells = (run_schemes if args.schemes else run_cli)(models, devices, repeat)
        info["loadavg"] = os.getloadavg()
        write_json(path, {"machine": info, "cells": cells})
    tables = render_schemes(cells) if args.schemes else (render_cli(cells),)
    print()
    print(machine_markdown(info))
    print(
        f"1-minute load average {info['loadavg_start'][0]:.2f} at the start; "
        f"{info['repeat']} repeat(s); models: {'; '.join(info['models'])}."
    )
    for table in tables:
        print()
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
