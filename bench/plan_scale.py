"""Plan time and peak RSS of ``sharderd plan`` on synthetic transformer stacks of 1k-100k nodes.

Each size is built once with ``examples.transformer`` and cached in ``bench/out/``; every
measurement is the real CLI (``sharderd plan MODEL --devices N --json``) in a fresh process, with
the child's own peak RSS from ``wait4``. Prints Markdown tables; raw numbers go to
``bench/out/plan_scale.json``.

    python bench/plan_scale.py              # 1k, 3k, 10k, 30k, 100k nodes
    python bench/plan_scale.py --quick      # up to 10k
    python bench/plan_scale.py --phases     # plus an in-process load/analyze/plan/report split
    python bench/plan_scale.py --profile 100000   # cProfile of the CLI at that size
    python bench/plan_scale.py --family exporter  # exporter-style GPT-2 graphs, shapes timed apart
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (  # bench/ is not a package: python puts this folder on sys.path
    OUT,
    Run,
    fmt_bytes,
    machine,
    machine_markdown,
    markdown_table,
    run_measured,
    sharderd_exe,
    write_json,
)

SIZES = (1_000, 3_000, 10_000, 30_000, 100_000)
QUICK_MAX = 10_000
DEVICES = 8
EXTRA_DEVICES = {10_000: (2, 16)}
FIT_FROM = 10_000
"""Below this, interpreter and import start-up (~0.7 s) dominate the wall time."""
SHAPE = {"hidden": 64, "seq": 32, "vocab": 256}
"""Small layers, so 100k nodes stay a ~0.5 GB file: the benchmark is about graph size, not bytes."""

_AT_LEAST = re.compile(r"At least (\d+) devices|rerun with --devices (\d+)")
_NO_SPLIT = (3, 5)
"""Exit codes of a plan that found no fitting split: proven (3) or not (5, since issue 28); the
stderr says how many devices to rerun on."""

_IMPORT_FLOOR = (
    "import sharderd.cli, sharderd.engine, sharderd.report.build, sharderd.report.markdown"
)

_PHASES_CHILD = r"""
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from sharderd.config import Config
from sharderd.engine import make_plan
from sharderd.graph.analyze import analyze
from sharderd.graph.load import load_model
from sharderd.report import build
t1 = time.perf_counter()
config = Config()
target = config.target(None)
loaded = load_model(Path(sys.argv[1]))
t2 = time.perf_counter()
analysis = analyze(loaded, config.plan)
t3 = time.perf_counter()
plan = make_plan(analysis, target, int(sys.argv[2]), config.plan)
t4 = time.perf_counter()
try:  # mirrors cli._cmd_plan; the report API is young, so a mismatch is reported, not fatal
    report = build.report_dict(
        model=build.model_facts(analysis), warnings=analysis.warnings, target=target,
        plan=build.plan_section(plan, config.plan.batch_size),
        batch_size=config.plan.batch_size, status="planned")
    json.dumps(report, indent=1)
    t5 = time.perf_counter() - t4
except TypeError:
    t5 = float("nan")
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "analyze": t3 - t2, "plan": t4 - t3,
                  "report": t5}))
"""


@dataclass(frozen=True, slots=True)
class Model:
    target_nodes: int
    layers: int
    nodes: int
    path: Path


@dataclass(frozen=True, slots=True)
class Case:
    model: Model
    devices: int
    runs: tuple[Run, ...]
    fallback: bool
    """Run because ``DEVICES`` did not fit: the device count the CLI said is needed."""

    @property
    def exit_code(self) -> int:
        return self.runs[-1].exit_code

    @property
    def wall_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    @property
    def min_wall_s(self) -> float:
        """The least-disturbed run: on a shared machine the median carries other people's load."""
        return min(r.wall_s for r in self.runs)

    @property
    def cpu_s(self) -> float:
        return statistics.median(r.user_s + r.sys_s for r in self.runs)

    @property
    def peak_rss(self) -> int:
        return max(r.peak_rss_bytes for r in self.runs)

    def planner(self) -> dict[str, Any] | None:
        """Median planner timings over the runs (``plan.planner`` of report.json)."""
        if self.exit_code != 0:
            return None
        reports = [r.json() for r in self.runs]
        timings = [rep["plan"]["planner"]["timings_s"] for rep in reports]
        solve = [sum(v for k, v in t.items() if k.startswith("solve")) for t in timings]
        first = reports[0]
        return {
            "total": statistics.median(t["total"] for t in timings),
            "orders": statistics.median(t.get("orders", 0.0) for t in timings),
            "solve": statistics.median(solve),
            "probes": first["plan"]["planner"]["probes"],
            "nodes": first["model"]["nodes"],
            "ratio_to_bound": first["plan"]["ratio_to_bound"],
        }


def layers_for(target_nodes: int) -> int:
    """Invert nodes(layers) = a·layers + b, measured on tiny builds rather than assumed."""
    from sharderd import examples

    one = len(examples.transformer(layers=1, **SHAPE).graph.node)
    two = len(examples.transformer(layers=2, **SHAPE).graph.node)
    per_layer, fixed = two - one, one - (two - one)
    return max(1, round((target_nodes - fixed) / per_layer))


def cached_model(target_nodes: int) -> Model:
    """Build and save the model once; later runs reuse the file (its node count is re-checked)."""
    import onnx

    from sharderd import examples

    layers = layers_for(target_nodes)
    path = OUT / f"transformer_L{layers}_h{SHAPE['hidden']}_s{SHAPE['seq']}_v{SHAPE['vocab']}.onnx"
    if not path.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        model = examples.transformer(layers=layers, **SHAPE)
        tmp = path.with_name(f".{path.name}.tmp")
        examples.save(model, tmp)
        tmp.replace(path)
        nodes = len(model.graph.node)
        del model
    else:
        nodes = len(onnx.load_model(str(path), load_external_data=False).graph.node)
    return Model(target_nodes, layers, nodes, path)


def measure(model: Model, devices: int, repeat: int, *, fallback: bool = False) -> Case:
    argv = (sharderd_exe(), "plan", str(model.path), "--devices", str(devices), "--json")
    runs = []
    for _ in range(repeat):
        run = run_measured(argv)
        if run.exit_code not in (0, *_NO_SPLIT):
            sys.exit(f"{' '.join(argv)} failed ({run.exit_code}):\n{run.stderr}")
        runs.append(run)
        if run.exit_code != 0:
            break
    case = Case(model, devices, tuple(runs), fallback)
    status = "ok" if case.exit_code == 0 else f"no fitting split (exit {case.exit_code})"
    print(
        f"  {model.nodes:>7} nodes, {devices:>2} devices: {case.wall_s:6.2f} s, "
        f"{fmt_bytes(case.peak_rss):>10} ({status})",
        file=sys.stderr,
    )
    return case


def needed_devices(case: Case) -> int | None:
    found = _AT_LEAST.search(case.runs[-1].stderr)
    return int(found.group(1) or found.group(2)) if found else None


def import_floor(repeat: int) -> Run:
    """Interpreter + sharderd/onnx/numpy imports: the fixed cost inside every wall time below.

    The fastest of ``repeat`` runs, as it is subtracted from the fastest run of each case.
    """
    runs = [run_measured((sys.executable, "-c", _IMPORT_FLOOR)) for _ in range(repeat)]
    return min(runs, key=lambda r: r.wall_s)


def phases(model: Model, devices: int) -> dict[str, float]:
    run = run_measured((sys.executable, "-c", _PHASES_CHILD, str(model.path), str(devices)))
    if run.exit_code != 0:
        sys.exit(f"phase split failed on {model.path}:\n{run.stderr}")
    return {**run.json(), "peak_rss": run.peak_rss_bytes}


def profile(model: Model, devices: int, top: int) -> None:
    """cProfile the real CLI in a child; print the hottest functions by self and cumulative time."""
    import pstats

    out = OUT / f"profile_{model.nodes}.pstats"
    argv = (sys.executable, "-m", "cProfile", "-o", str(out), sharderd_exe(), "plan")
    run = run_measured((*argv, str(model.path), "--devices", str(devices), "--json"))
    print(
        f"cProfile of `sharderd plan` on {model.nodes} nodes, {devices} devices "
        f"(exit {run.exit_code}, {run.wall_s:.2f} s under the profiler); raw: {out}\n"
    )
    for key in ("tottime", "cumulative"):
        print(f"--- top {top} by {key} ---")
        pstats.Stats(str(out)).sort_stats(key).print_stats(top)


def loglog_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares exponent k in t ∝ n^k: 1.0 is linear growth."""
    points = [(math.log(n), math.log(t)) for n, t in points if t > 0]
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else None


def main_table(cases: list[Case]) -> str:
    rows = []
    for c in cases:
        p = c.planner()
        head = [
            c.model.nodes,
            c.model.layers,
            f"{c.model.path.stat().st_size / 2**20:.0f}",
            f"{c.devices}" + (" (fewest that fit)" if c.fallback else ""),
            f"{c.wall_s:.2f}",
            f"{c.min_wall_s:.2f}",
            f"{c.cpu_s:.2f}",
        ]
        tail = [f"{c.peak_rss / 2**20:.0f}", f"{1e6 * c.min_wall_s / c.model.nodes:.0f}"]
        if p is None:
            rows.append([*head, f"no fitting split (exit {c.exit_code})", "", "", "", *tail])
            continue
        if p["nodes"] != c.model.nodes:
            sys.exit(f"report says {p['nodes']} nodes, the file has {c.model.nodes}")
        rows.append(
            [
                *head,
                f"{p['total']:.3f}",
                f"{p['orders']:.3f}",
                f"{p['solve']:.3f}",
                p["probes"],
                *tail,
            ]
        )
    header = [
        "nodes",
        "layers",
        "file MiB",
        "devices",
        "wall s (median)",
        "wall s (min)",
        "CPU s",
        "planner s",
        "orders s",
        "solve s",
        "probes",
        "peak RSS MiB",
        "µs/node (min wall)",
    ]
    return markdown_table(header, rows)


def scaling_summary(cases: list[Case], floor: Run) -> str:
    """Growth exponents; wall and RSS only from sizes where start-up is not most of the number."""
    ok = [c for c in cases if c.exit_code == 0 and (c.devices == DEVICES or c.fallback)]
    by_size = {c.model.nodes: c for c in ok}
    big = {n: c for n, c in by_size.items() if n >= FIT_FROM}
    walls = [(n, c.min_wall_s - floor.wall_s) for n, c in big.items()]
    cpus = [(n, c.cpu_s - floor.user_s - floor.sys_s) for n, c in big.items()]
    rss = [(n, c.peak_rss - floor.peak_rss_bytes) for n, c in big.items()]
    plans = [(n, c.planner()["total"]) for n, c in by_size.items()]  # type: ignore[index]
    parts = []
    for label, pts in (
        (f"min wall − import floor (≥ {FIT_FROM} nodes)", walls),
        (f"CPU − import floor (≥ {FIT_FROM} nodes)", cpus),
        (f"peak RSS − floor (≥ {FIT_FROM} nodes)", rss),
        ("planner total (all sizes)", plans),
    ):
        k = loglog_slope(pts)
        parts.append(f"{label} ∝ n^{k:.2f}" if k is not None else f"{label}: too few points")
    return "Log-log fit (1.00 = linear): " + "; ".join(parts) + "."


def phases_table(split: list[tuple[Model, int, dict[str, float]]]) -> str:
    keys = ("import", "load", "analyze", "plan", "report")
    rows = [
        [
            m.nodes,
            d,
            *(f"{v[k]:.2f}" for k in keys),
            f"{sum(v[k] for k in keys):.2f}",
            f"{v['peak_rss'] / 2**20:.0f}",
        ]
        for m, d, v in split
    ]
    return markdown_table(
        ["nodes", "devices", *(f"{k} s" for k in keys), "sum s", "peak RSS MiB"], rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes up to {QUICK_MAX} nodes only")
    parser.add_argument("--sizes", type=int, nargs="+", help="node counts (default: 1k..100k)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; medians reported")
    parser.add_argument("--phases", action="store_true", help="also split time by engine phase")
    parser.add_argument("--profile", type=int, metavar="NODES", help="only cProfile this size")
    parser.add_argument("--top", type=int, default=25, help="rows per --profile listing")
    parser.add_argument(
        "--json-out", type=Path, default=OUT / "plan_scale.json", help="where the raw numbers go"
    )
    parser.add_argument(
        "--family",
        choices=("transformer", "exporter"),
        default="transformer",
        help="exporter: GPT-2 graphs as torch.onnx.export writes them, shape propagation timed "
        "apart (bench/exporter_scale.py)",
    )
    args = parser.parse_args()
    if args.family == "exporter":
        import exporter_scale

        return exporter_scale.main(args)

    if args.profile:
        model = cached_model(args.profile)
        probe = measure(model, DEVICES, 1)
        devices = (needed_devices(probe) or DEVICES) if probe.exit_code in _NO_SPLIT else DEVICES
        profile(model, devices, args.top)
        return 0

    sizes = args.sizes or [n for n in SIZES if not args.quick or n <= QUICK_MAX]
    print(f"building/reusing models in {OUT}", file=sys.stderr)
    models = [cached_model(n) for n in sizes]
    floor = import_floor(max(3, args.repeat))
    cases: list[Case] = []
    split: list[tuple[Model, int, dict[str, float]]] = []
    for model in models:
        for devices in (DEVICES, *EXTRA_DEVICES.get(model.target_nodes, ())):
            case = measure(model, devices, args.repeat)
            cases.append(case)
            fits = case.devices
            if case.exit_code in _NO_SPLIT and (need := needed_devices(case)) is not None:
                cases.append(measure(model, need, args.repeat, fallback=True))
                fits = need
            if args.phases and devices == DEVICES:
                split.append((model, fits, phases(model, fits)))

    info = machine()
    print(machine_markdown(info) + "\n")
    print(
        f"`sharderd plan MODEL --devices N --json`, target ipu-mk2, transformer(hidden="
        f"{SHAPE['hidden']}, seq={SHAPE['seq']}, vocab={SHAPE['vocab']}); {args.repeat} run(s) "
        "per row. CPU = user + sys of the child (median): less sensitive than wall time to "
        "other load on the machine.\n"
    )
    print(main_table(cases) + "\n")
    print(
        f"Import floor (fresh interpreter importing the CLI and engine): "
        f"{floor.wall_s:.2f} s wall, {floor.user_s + floor.sys_s:.2f} s CPU, "
        f"{floor.peak_rss_bytes / 2**20:.0f} MiB.\n"
    )
    print(scaling_summary(cases, floor) + "\n")
    if split:
        print("In-process phase split (one fresh process per row; `report` includes JSON):\n")
        print(phases_table(split) + "\n")

    write_json(
        args.json_out,
        {
            "machine": info,
            "floor": {
                "wall_s": floor.wall_s,
                "cpu_s": floor.user_s + floor.sys_s,
                "peak_rss_bytes": floor.peak_rss_bytes,
            },
            "cases": [
                {
                    "nodes": c.model.nodes,
                    "layers": c.model.layers,
                    "devices": c.devices,
                    "fallback": c.fallback,
                    "exit_code": c.exit_code,
                    "wall_s": [r.wall_s for r in c.runs],
                    "cpu_s": [r.user_s + r.sys_s for r in c.runs],
                    "peak_rss_bytes": [r.peak_rss_bytes for r in c.runs],
                    "planner": c.planner(),
                }
                for c in cases
            ],
            "phases": [{"nodes": m.nodes, "devices": d, **v} for m, d, v in split],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
