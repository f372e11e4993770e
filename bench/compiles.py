"""Compiles to the first success: ``sharderd shard --backend poprt`` vs the seed's search.

Both run against the fake PopRT compiler (tests/fake_poprt) on a small 24-tile IPU, so a model needs
several devices, under the fake's default memory truth and harsher ones. The truth is *not*
sharderd's model: sharderd has to learn it from OOM texts, the seed has to stumble into it.

Which device counts fit is decided independently of both tools, from the fake's own memory function:

- *fits* at N: a witness split exists. A greedy packer walks the fake's topological order, cuts
  each stage as late as the fake's worst-tile bytes allow (bisection), and the whole split is then
  checked with the same function. The smallest such N is "min".
- *cannot fit* at N: proven. Every device holds its weights and code spread over its tiles, so
  ``N ≥ (weights × weight_factor + code) × imbalance / ((tile bytes − overhead) × tiles)``; any N
  below that bound cannot fit, whatever the split or the AMP.

Each cell runs both tools once, each in a fresh process, and records compiles (from
``FAKE_POPRT_LOG``), wall time, and for a success the slowest stage's predicted time over sharderd's
lower bound (perfect balance or the dearest node), the seed's split costed with sharderd's model.

    python bench/compiles.py                       # full matrix, prints Markdown
    python bench/compiles.py --quick               # default truth, 2 models
    python bench/compiles.py --write-benchmarks    # also (re)writes "## Compile attempts" in BENCHMARKS.md
    python bench/compiles.py --seed-from OLD.json  # the seed's runs of an earlier run, reused
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from _common import (  # bench/ is not a package: python puts this folder on sys.path
    OUT,
    machine,
    machine_markdown,
    markdown_table,
    mini_target_config,
    write_json,
)
from onnx import helper

from sharderd import examples
from sharderd.config import load_config
from sharderd.engine import analyze_file
from sharderd.graph.analyze import Analysis
from sharderd.plan.ordered_costs import ordered_costs
from sharderd.plan.planner import lower_bound
from sharderd.target import Target

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_poprt"
SEED = Path(__file__).resolve().parent / "seed_search.py"
WORK = OUT / "compiles"
BENCHMARKS = REPO / "BENCHMARKS.md"
SECTION = "## Compile attempts"
TILES = 24
TILE_BYTES = 638_976
CONFIG = mini_target_config(TILES, TILE_BYTES)
DEFAULT_AMP = 0.6
LOWEST_AMP = 0.1
SEED_MAX_COMPILES = 30


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    build: Callable[..., onnx.ModelProto]
    options: Mapping[str, int]

    @property
    def label(self) -> str:
        return f"{self.name} ({', '.join(f'{k} {v}' for k, v in self.options.items())})"


MODELS = (
    ModelSpec("transformer", examples.transformer, {"layers": 8, "hidden": 256}),
    ModelSpec("cnn", examples.cnn, {"blocks": 8, "channels": 64}),
    ModelSpec("shared_weights", examples.shared_weights, {"layers": 40, "hidden": 512}),
    ModelSpec("chain", examples.chain, {"nodes": 200, "hidden": 384}),
)
TRUTHS: Mapping[str, Mapping[str, Any]] = {
    "default": {},
    "imbalance 1.8": {"imbalance": 1.8},
    "weights ×1.3": {"weight_factor": 1.3},
    "Gather code 4 MB": {"code_bytes": {"Gather": 4_000_000}},
    "largest op on 40% of tiles": {"op_tiles": 0.4},
    "per-op code + exchange": {
        "code_bytes": {"MatMul": 262_144, "Conv": 196_608},
        "exchange_by_op": {"Gather": 4.0, "MatMul": 1.0, "Conv": 1.0},
    },
    "noise ±10%": {"noise": 0.1},
}
"""``FAKE_POPRT_TRUTH`` values. The first four scale the uniform worst tile (the family sharderd's
correction assumes); the last three do not: the worst tile is the biggest op's, exchange and code
follow op types, or every split scatters. A truth that changes nothing for a model (no Gather) is
skipped."""


# --- the fake's own truth: which device counts fit -------------------------------------------------


@cache
def _fake_compiler() -> ModuleType:
    if str(FAKE) not in sys.path:
        sys.path.insert(0, str(FAKE))
    import poprt.compiler

    return poprt.compiler


@dataclass(frozen=True, slots=True)
class Feasibility:
    min_fit: int | None
    """Fewest devices with a witness split at the default AMP (None: none up to the cap)."""
    min_fit_lowest_amp: int | None
    """The same at AMP 0.1, the lowest either tool tries."""
    proven_below: int
    """Every count below this is proven not to fit."""
    node_too_big: str | None = None
    """A node that overflows a device on its own even at AMP 0.1: no count fits."""


class TruthOracle:
    """The fake's memory function, evaluated in-process on any assignment (no compile, no files)."""

    def __init__(self, model: onnx.ModelProto, truth: Mapping[str, Any]) -> None:
        fake = _fake_compiler()
        self._fake = fake
        self.graph = fake._Graph(model)
        self.truth = dict(truth)
        self.knobs = fake.Knobs(
            tiles=TILES,
            tile_bytes=TILE_BYTES,
            truth=fake.Truth.from_env(json.dumps(dict(truth))),
            mode="normal",
            compile_seconds=0.0,
            log=None,
        )

    def worst_tile(self, ipus: Sequence[int], devices: int, amp: float) -> np.ndarray:
        options = self._fake.CompilerOptions(
            num_ipus=devices, virtual_graph_mode="manual", available_memory_proportion=amp
        )
        return self._fake._worst_tile_bytes(self.graph, list(ipus), options, self.knobs)

    def proven_below(self) -> int:
        truth = self.knobs.truth
        used = {name for name in self.graph.consumers if name in self.graph.weights}
        weights = sum(self.graph.weights[name] for name in used) * truth.weight_factor
        code = sum(truth.code_bytes.get(n.op_type, truth.code_default) for n in self.graph.nodes)
        # the worst tile is at least the uniform share × imbalance, scattered down by the noise at most
        per_device = (
            (TILE_BYTES - truth.tile_overhead) * TILES / (truth.imbalance * (1 - truth.noise))
        )
        return max(1, math.ceil((weights + code) / per_device))

    def greedy_split(self, amp: float, cap: int = 32) -> list[int] | None:
        """A contiguous split of the fake's topological order, each stage cut as late as the truth
        allows (bisection on the end), or None when some stage cannot take even one node."""
        order = list(self.graph.order)
        ipus = [0] * len(order)

        def fits(start: int, end: int, stage: int) -> bool:
            for k in order[start:end]:
                ipus[k] = stage
            for k in order[end:]:
                ipus[k] = stage + 1
            return bool(self.worst_tile(ipus, stage + 2, amp)[stage] <= TILE_BYTES)

        start, stage = 0, 0
        while start < len(order):
            if stage >= cap or not fits(start, start + 1, stage):
                return None
            lo, hi = start + 1, len(order)
            if fits(start, hi, stage):
                lo = hi
            while hi - lo > 1:  # lo fits, hi does not
                mid = (lo + hi) // 2
                if fits(start, mid, stage):
                    lo = mid
                else:
                    hi = mid
            for k in order[start:lo]:
                ipus[k] = stage
            start, stage = lo, stage + 1
        return ipus

    def compiles(self, ipus: Sequence[int], amp: float) -> bool:
        """Compile the split with the fake itself (pipelined, as sharderd does): the witness."""
        fake = self._fake
        model = onnx.ModelProto()
        model.CopyFrom(self.graph.model)
        for node, ipu in zip(model.graph.node, ipus, strict=True):
            node.attribute.append(helper.make_attribute("__ipu_number", ipu))
            node.attribute.append(helper.make_attribute("__pipeline_stage", ipu))
        devices = max(ipus) + 1
        options = fake.CompilerOptions(
            num_ipus=devices,
            virtual_graph_mode="manual",
            enable_pipelining=devices > 1,
            batches_per_step=devices,
            available_memory_proportion=amp,
        )
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("FAKE_POPRT")}
        os.environ.update(FAKE_POPRT_TILES=str(TILES), FAKE_POPRT_TRUTH=json.dumps(self.truth))
        try:
            fake.Compiler.compile(model, None, options)
        except RuntimeError:
            return False
        finally:
            for k in [k for k in os.environ if k.startswith("FAKE_POPRT")]:
                del os.environ[k]
            os.environ.update(saved)
        return True

    def min_fit(self, amp: float) -> int | None:
        ipus = self.greedy_split(amp)
        if ipus is None or not self.compiles(ipus, amp):
            return None
        return max(ipus) + 1

    def node_too_big(self) -> str | None:
        """The first node that alone (everything else on a second device) overflows its device."""
        for k, node in enumerate(self.graph.nodes):
            ipus = [1] * len(self.graph.nodes)
            ipus[k] = 0
            if self.worst_tile(ipus, 2, LOWEST_AMP)[0] > TILE_BYTES:
                return node.name
        return None

    def feasibility(self) -> Feasibility:
        return Feasibility(
            self.min_fit(DEFAULT_AMP),
            self.min_fit(LOWEST_AMP),
            self.proven_below(),
            self.node_too_big(),
        )


# --- costing the seed's split with sharderd's model -------------------------------------------------


@dataclass(frozen=True, slots=True)
class SplitCost:
    ratio_to_bound: float
    """Slowest device's predicted time / sharderd's lower bound for the same device count."""
    flops_max_over_mean: float
    devices_used: int
    pipeline: bool
    """False: some tensor flows from a later IPU back to an earlier one (not a pipeline order)."""


def split_cost(
    analysis: Analysis, target: Target, ipu_of: Mapping[str, int], devices: int
) -> SplitCost:
    """Cost an arbitrary node → IPU map the way sharderd costs its own stages.

    Nodes are ordered by (IPU, topological position); when that is a topological order every IPU
    is one interval and sharderd's interval costs apply as they do to its own plans. Otherwise each
    IPU is charged its nodes' time plus every byte it sends or receives at link speed.
    """
    flow = analysis.flow
    ipu = np.array([ipu_of[name] for name in flow.node_names], dtype=np.int64)
    topo_pos = np.empty(flow.num_nodes, dtype=np.int64)
    topo_pos[flow.topo_order] = np.arange(flow.num_nodes)
    order = np.lexsort((topo_pos, ipu))
    oc = ordered_costs(analysis, target, order)
    bound = lower_bound(oc, devices)
    flops = np.bincount(ipu, weights=analysis.costs.flops, minlength=devices)
    flops_ratio = float(flops.max() / flops.mean()) if flops.mean() > 0 else 1.0
    used = len(np.unique(ipu))

    producer = flow.producer
    consumer_of = np.repeat(np.arange(flow.num_tensors), np.diff(flow.cons_ptr))
    made = producer[consumer_of]
    inner = made >= 0
    src, dst = ipu[made[inner]], ipu[flow.cons_idx[inner]]
    if (src <= dst).all():
        counts = np.bincount(ipu, minlength=devices)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        slowest = max(oc.stage_time(a, b) for a, b in itertools.pairwise(bounds.tolist()))
        return SplitCost(slowest / bound, flops_ratio, used, True)
    times = np.bincount(ipu[order], weights=oc.node_time, minlength=devices)
    tbytes = analysis.costs.tensor_bytes[consumer_of[inner]]
    crossing = src != dst
    traffic = np.bincount(src[crossing], weights=tbytes[crossing], minlength=devices)
    traffic += np.bincount(dst[crossing], weights=tbytes[crossing], minlength=devices)
    slowest = float((times + traffic / target.link_bytes_per_s).max())
    return SplitCost(slowest / bound, flops_ratio, used, False)


# --- running the tools ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolRun:
    outcome: str
    """``compiled``, ``does not fit`` (sharderd, exit 3), ``not proven`` (sharderd, exit 5),
    ``gave up`` (the seed) or ``error``."""
    compiles: int
    """Compile calls that finished up to the first success (all of them otherwise)."""
    lower_amp: int
    """Of those, compiles at a lowered available_memory_proportion."""
    cancelled: int
    wall_s: float
    ratio: float | None
    flops_ratio: float | None
    devices_used: int | None
    detail: str
    command: str


def _env(truth: Mapping[str, Any], log: Path, *, sharderd_on_path: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_POPRT")}
    env.pop("POPLAR_ENGINE_OPTIONS", None)
    paths = [str(FAKE), str(REPO)] if sharderd_on_path else [str(FAKE)]
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        FAKE_POPRT_TILES=str(TILES),
        FAKE_POPRT_LOG=str(log),
        FAKE_POPRT_TRUTH=json.dumps(dict(truth)),
    )
    return env


def _compile_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _count(log: list[dict[str, Any]], devices: int) -> tuple[int, int]:
    """(compiles up to and including the first ok of the whole model, or all; of those at a
    lowered AMP). A probe (one node on one IPU) counts as a compile, its success is no result."""
    first_ok = next(
        (
            i
            for i, r in enumerate(log)
            if r["result"] == "ok" and r["options"]["num_ipus"] == devices
        ),
        None,
    )
    counted = log if first_ok is None else log[: first_ok + 1]
    lowered = sum(
        1
        for r in counted
        if min([r["options"]["available_memory_proportion"], *r.get("op_amps", ())]) < DEFAULT_AMP
    )
    return len(counted), lowered


def _shell(argv: Sequence[str], truth: Mapping[str, Any]) -> str:
    rel = [os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a for a in argv]
    rel[0] = "python"
    env = f"FAKE_POPRT_TILES={TILES} FAKE_POPRT_TRUTH='{json.dumps(dict(truth))}'"
    return f"PYTHONPATH=tests/fake_poprt:. {env} {' '.join(rel)}"


def run_sharderd(
    model: Path,
    devices: int,
    truth: Mapping[str, Any],
    cell: Path,
    config: Path,
    parallel: int | None,
) -> ToolRun:
    log = cell / "sharderd.compiles.jsonl"
    out = cell / "sharderd"
    argv = [
        sys.executable,
        "-m",
        "sharderd.cli",
        "shard",
        str(model),
        "--devices",
        str(devices),
        "--backend",
        "poprt",
        "--config",
        str(config),
        "--out",
        str(out),
        "--quiet",
    ]
    if parallel is not None:
        argv += ["--parallel", str(parallel)]
    began = time.perf_counter()
    proc = subprocess.run(
        argv,
        env=_env(truth, log, sharderd_on_path=True),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    wall = time.perf_counter() - began
    compiles, lowered = _count(_compile_log(log), devices)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    cancelled = sum(1 for a in report.get("attempts", []) if a["outcome"] == "cancelled")
    for path in out.rglob("*"):  # keep the reports; the sharded model and PopEF are 1.5 GB a matrix
        if path.is_file() and not path.name.startswith("report."):
            path.unlink()
    command = _shell(argv, truth)
    if proc.returncode == 0:
        plan = report["plan"]
        return ToolRun(
            "compiled",
            compiles,
            lowered,
            cancelled,
            wall,
            float(plan["ratio_to_bound"]),
            None,
            int(plan["devices"]),
            "",
            command,
        )
    if proc.returncode == 3:
        grounds = (report.get("verdict") or {}).get("grounds") or "planner (no report)"
        detail = next((line for line in proc.stderr.splitlines() if "error:" in line), "")
        detail = f"[{grounds}] {detail}"
        return ToolRun(
            "does not fit", compiles, lowered, cancelled, wall, None, None, None, detail, command
        )
    if proc.returncode == 5:  # no fitting split found, not proven (exit 5)
        detail = next((line for line in proc.stderr.splitlines() if "error:" in line), "")
        return ToolRun(
            "not proven", compiles, lowered, cancelled, wall, None, None, None, detail, command
        )
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    return ToolRun(
        "error",
        compiles,
        lowered,
        cancelled,
        wall,
        None,
        None,
        None,
        f"exit {proc.returncode}: {tail}",
        command,
    )


def run_seed(
    model: Path,
    devices: int,
    truth: Mapping[str, Any],
    cell: Path,
    analysis: Analysis,
    target: Target,
) -> ToolRun:
    log = cell / "seed.compiles.jsonl"
    argv = [
        sys.executable,
        str(SEED),
        str(model),
        "--num-ipus",
        str(devices),
        "--tiles",
        str(TILES),
        "--max-compiles",
        str(SEED_MAX_COMPILES),
    ]
    began = time.perf_counter()
    proc = subprocess.run(
        argv,
        env=_env(truth, log, sharderd_on_path=False),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.perf_counter() - began
    compiles, lowered = _count(_compile_log(log), devices)
    command = _shell(argv, truth)
    if proc.returncode not in (0, 3):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return ToolRun(
            "error",
            compiles,
            lowered,
            0,
            wall,
            None,
            None,
            None,
            f"exit {proc.returncode}: {tail}",
            command,
        )
    data = json.loads(proc.stdout)
    groups = len(data["groups"])
    detail = f"{data['blocks']} blocks, {groups} groups"
    if data["status"] != "compiled":
        return ToolRun("gave up", compiles, lowered, 0, wall, None, None, None, detail, command)
    cost = split_cost(analysis, target, data["assignment"], devices)
    if not cost.pipeline:
        detail += ", not a pipeline order"
    return ToolRun(
        "compiled",
        compiles,
        lowered,
        0,
        wall,
        cost.ratio_to_bound,
        cost.flops_max_over_mean,
        cost.devices_used,
        detail,
        command,
    )


# --- the matrix ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    model: str
    truth: str
    devices: int
    expected: str
    """``fits``, ``fits at amp 0.1``, ``cannot fit`` (proven) or ``unknown`` (no witness, no proof)."""
    sharderd: ToolRun
    seed: ToolRun


def _expected(devices: int, feas: Feasibility) -> str:
    if feas.node_too_big is not None:
        return "cannot fit (any N)"
    if feas.min_fit is not None and devices >= feas.min_fit:
        return "fits"
    if feas.min_fit_lowest_amp is not None and devices >= feas.min_fit_lowest_amp:
        return "fits at amp 0.1"
    return "cannot fit" if devices < feas.proven_below else "unknown"


def device_counts(feas: Feasibility) -> list[int]:
    """The largest proven-short count, min - 1 (if not proven), min, min + 1, min + 2.

    When one node can never fit, the proven-short count and two counts above the bound.
    """
    counts = {feas.proven_below - 1}
    if feas.node_too_big is not None:
        counts |= {feas.proven_below, feas.proven_below + 2}
    elif feas.min_fit is not None:
        counts |= {feas.min_fit - 1, feas.min_fit, feas.min_fit + 1, feas.min_fit + 2}
    return sorted(c for c in counts if c >= 2)


def build_model(spec: ModelSpec) -> Path:
    path = WORK / f"{spec.name}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        examples.save(spec.build(**spec.options), path)
    return path


def applies(truth: Mapping[str, Any], model: onnx.ModelProto) -> bool:
    """A per-op code override only matters for a model that has that op."""
    ops = {n.op_type for n in model.graph.node}
    by_op = set(truth.get("code_bytes", {})) | set(truth.get("exchange_by_op", {}))
    return not by_op or bool(by_op & ops)


def run_matrix(
    models: Sequence[ModelSpec],
    truths: Mapping[str, Mapping[str, Any]],
    parallel: int | None,
    progress: Callable[[str], None],
    seeds: Mapping[tuple[str, str, int], ToolRun] | None = None,
) -> tuple[list[Cell], dict[str, dict[str, Feasibility]]]:
    """Every cell of ``models`` × ``truths``; ``seeds``: the seed's runs of an earlier run of this
    script, reused for the cells it has (the seed's search does not change with sharderd's)."""
    WORK.mkdir(parents=True, exist_ok=True)
    config = WORK / "mini.toml"
    config.write_text(CONFIG)
    loaded = load_config(config)
    target = loaded.target(None)
    cells: list[Cell] = []
    feasibility: dict[str, dict[str, Feasibility]] = {}
    for spec in models:
        path = build_model(spec)
        proto = onnx.load(path)
        analysis = analyze_file(path, loaded.plan)
        for truth_name, truth in truths.items():
            if not applies(truth, proto):
                continue
            feas = TruthOracle(proto, truth).feasibility()
            feasibility.setdefault(spec.name, {})[truth_name] = feas
            progress(f"{spec.name} / {truth_name}: {feas}")
            for devices in device_counts(feas):
                cell_dir = WORK / "runs" / f"{spec.name}-{_slug(truth_name)}-{devices}"
                _clean(cell_dir)
                s = run_sharderd(path, devices, truth, cell_dir, config, parallel)
                seed = (seeds or {}).get((spec.name, truth_name, devices)) or run_seed(
                    path, devices, truth, cell_dir, analysis, target
                )
                cells.append(
                    Cell(spec.name, truth_name, devices, _expected(devices, feas), s, seed)
                )
                progress(
                    f"  N={devices}: sharderd {s.outcome} in {s.compiles}, seed {seed.outcome} in {seed.compiles}"
                )
    return cells, feasibility


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _clean(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


# --- the verdict ---------------------------------------------------------------------------------


def problems(cells: Sequence[Cell]) -> list[str]:
    """Where sharderd misbehaved: a crash, a "does not fit" (exit 3) where a witness split compiles
    in the fake, no success where one does, or a compile of a count proven impossible. Compile
    counts are reported, not judged here (they are the fake's, not a target)."""
    found = []
    for c in cells:
        s = c.sharderd
        where = f"{c.model} / {c.truth} / N={c.devices}"
        if s.outcome == "error":
            found.append(f"crash: {where}: {s.detail}: `{s.command}`")
        elif s.outcome == "does not fit" and c.expected.startswith("fits"):
            found.append(
                f'wrong "does not fit" after {s.compiles} compile(s): {where} (the truth {c.expected}): `{s.command}`'
            )
        elif s.outcome == "compiled" and c.expected.startswith("cannot fit"):
            found.append(f"compiled a proven-impossible count (bench bug?): {where}: `{s.command}`")
        elif s.outcome != "compiled" and c.expected.startswith("fits"):
            found.append(
                f"no success where the truth {c.expected}: {where}: {s.outcome} after {s.compiles} compile(s): `{s.command}`"
            )
    return found


def _fmt_run(run: ToolRun) -> str:
    if run.outcome == "compiled":
        text = f"**{run.compiles}** ✓"
    elif run.outcome == "does not fit":
        text = f"{run.compiles} ✗ does not fit"
    elif run.outcome == "gave up":
        text = f"{run.compiles} ✗ gave up"
    elif run.outcome == "not proven":
        text = f"{run.compiles} ✗ not proven (exit 5)"
    else:
        text = f"{run.compiles} error"
    extra = []
    if run.lower_amp:
        extra.append(f"{run.lower_amp} at low amp")
    if run.cancelled:
        extra.append(f"+{run.cancelled} cancelled")
    return text + (f" ({', '.join(extra)})" if extra else "")


def _fmt_ratio(run: ToolRun, devices: int) -> str:
    if run.ratio is None:
        return "–"
    text = f"{run.ratio:.2f}"
    if run.devices_used is not None and run.devices_used < devices:
        text += f" ({run.devices_used}/{devices} used)"
    return text


def table(cells: Sequence[Cell]) -> str:
    header = [
        "model",
        "truth",
        "N",
        "truth says",
        "sharderd compiles",
        "seed compiles",
        "sharderd s",
        "seed s",
        "sharderd slowest/bound",
        "seed slowest/bound",
        "seed FLOPs max/mean",
    ]
    rows = []
    for c in cells:
        rows.append(
            [
                c.model,
                c.truth,
                c.devices,
                c.expected,
                _fmt_run(c.sharderd),
                _fmt_run(c.seed),
                f"{c.sharderd.wall_s:.1f}",
                f"{c.seed.wall_s:.1f}",
                _fmt_ratio(c.sharderd, c.devices),
                _fmt_ratio(c.seed, c.devices),
                "–" if c.seed.flops_ratio is None else f"{c.seed.flops_ratio:.2f}",
            ]
        )
    return markdown_table(header, rows)


def _median(values: Sequence[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}g}" if values else "–"


def summary(cells: Sequence[Cell]) -> str:
    fits = [c for c in cells if c.expected == "fits"]
    s_ok = [c.sharderd.compiles for c in fits if c.sharderd.outcome == "compiled"]
    seed_ok = [c.seed.compiles for c in fits if c.seed.outcome == "compiled"]
    both = [c for c in fits if c.sharderd.ratio is not None and c.seed.ratio is not None]
    short = [c for c in cells if c.expected.startswith("cannot fit")]
    s_short = [c.sharderd for c in short if c.sharderd.outcome == "does not fit"]
    s_unproven = [c.sharderd for c in short if c.sharderd.outcome == "not proven"]
    seed_short = [c.seed.compiles for c in short]
    return (
        f"**Truth fits** ({len(fits)} cells): sharderd compiled {len(s_ok)}/{len(fits)}, median "
        f"**{_median(s_ok)}** compile(s) to the first success (max {max(s_ok, default=0)}); the seed "
        f"compiled {len(seed_ok)}/{len(fits)}, median **{_median(seed_ok)}** (max {max(seed_ok, default=0)}). "
        f"Where both compiled ({len(both)}), the slowest stage over the bound: sharderd median "
        f"{_median([c.sharderd.ratio or 0 for c in both])}, seed {_median([c.seed.ratio or 0 for c in both])}. "
        f'**Proven too few devices** ({len(short)} cells): sharderd said "does not fit" (exit 3, with '
        f'its grounds) in {len(s_short)}/{len(short)} and "not proven" (exit 5) in '
        f"{len(s_unproven)}/{len(short)}; exit 3 after a median of **{_median([r.compiles for r in s_short])}** "
        f"compiles (max {max((r.compiles for r in s_short), default=0)}; AMP retries aside: median "
        f"{_median([r.compiles - r.lower_amp for r in s_short])}, max "
        f"{max((r.compiles - r.lower_amp for r in s_short), default=0)}); the seed gave up after a median "
        f"of {_median(seed_short)} (max {max(seed_short, default=0)}). Wall time per run: sharderd median "
        f"{_median([c.sharderd.wall_s for c in cells], 2)} s, seed {_median([c.seed.wall_s for c in cells], 2)} s."
    )


def _spread(values: Sequence[int]) -> str:
    return f"{_median(values)} / {max(values)}" if values else "–"


def per_truth_table(cells: Sequence[Cell]) -> str:
    """Per truth family: compiles to a success where the truth fits, to a verdict where it cannot,
    and wrong verdicts (anything but a success where a witness split exists: exit 3, exit 5, a give-up)."""
    rows = []
    for truth in dict.fromkeys(c.truth for c in cells):
        mine = [c for c in cells if c.truth == truth]
        fits = [c for c in mine if c.expected.startswith("fits")]
        short = [c for c in mine if c.expected.startswith("cannot fit")]
        row: list[Any] = [truth, len(fits), len(short)]
        for tool in ("sharderd", "seed"):
            runs = [getattr(c, tool) for c in fits]
            ok = [r.compiles for r in runs if r.outcome == "compiled"]
            wrong = sum(1 for r in runs if r.outcome != "compiled")
            settled = [
                getattr(c, tool).compiles for c in short if getattr(c, tool).outcome != "compiled"
            ]
            row += [f"{len(ok)}/{len(fits)}", _spread(ok), wrong, _spread(settled)]
        rows.append(row)
    return markdown_table(
        [
            "truth",
            "cells: fits",
            "cells: cannot fit",
            "sharderd compiled",
            "sharderd compiles to success (median / max)",
            "sharderd wrong verdicts",
            'sharderd compiles to "does not fit" (median / max)',
            "seed compiled",
            "seed compiles to success (median / max)",
            "seed wrong verdicts",
            "seed compiles to give up (median / max)",
        ],
        rows,
    )


def feasibility_table(feas: Mapping[str, Mapping[str, Feasibility]]) -> str:
    rows = []
    for model, by_truth in feas.items():
        for truth, f in by_truth.items():
            rows.append(
                [
                    model,
                    truth,
                    f.proven_below - 1,
                    f.min_fit or "–",
                    f.min_fit_lowest_amp or "–",
                    f"`{f.node_too_big}`" if f.node_too_big else "–",
                ]
            )
    return markdown_table(
        [
            "model",
            "truth",
            "proven short at ≤",
            "min with a witness (amp 0.6)",
            "min (amp 0.1)",
            "node too big for any N",
        ],
        rows,
    )


def section(
    cells: Sequence[Cell],
    feas: Mapping[str, Mapping[str, Feasibility]],
    command: str,
    found: Sequence[str],
    info: Mapping[str, Any],
) -> str:
    models = ", ".join(spec.label for spec in MODELS if spec.name in feas)
    truths = "; ".join(f"{name} `{json.dumps(dict(t))}`" for name, t in TRUTHS.items())
    lines = [
        SECTION,
        "",
        "How many compiles it takes to prove a plan, `sharderd shard --backend poprt` against a re-implementation "
        "of the seed's search (`bench/seed_search.py`: weight-bytes split, blind boundary moves on OOM, AMP 0.3/0.1 "
        f"retries, capped at {SEED_MAX_COMPILES} compiles), both against the fake PopRT (`tests/fake_poprt`) "
        f"on a {TILES}-tile IPU ({TILES} × 624 KiB). The fake's memory truth is not sharderd's model. "
        f"Models: {models}. Truths: {truths}. The first four keep the fake's worst tile a uniform share "
        "of the device's load × an imbalance (the family a factor on bytes fits best); the last "
        "three do not: the worst tile is the biggest op's (its weights, operands and temporaries on 40% "
        "of the tiles, as a big matmul's partials or an embedding's rows), exchange and code follow op "
        "types, or every split's worst tile scatters by up to ±10%. Targets (issue 28): no wrong \"does "
        'not fit" (exit 3); every cell where the witness split exists ends in exit 0, median ≤ 2 '
        "compiles; the others in exit 3 with its grounds (`verdict.grounds`: `weights_total`, "
        '`node_weights`, `probe`) or exit 5 ("no fitting split found (not proven)"). Compile counts '
        "are the fake's and are reported, not tuned for.",
        "",
        '"truth says" comes from neither tool: *fits* = a greedy split checked with the fake\'s own memory '
        "function exists; *cannot fit* = proven by the fake's weights and code alone (the bench's own "
        "bound, from the fake's truth; sharderd's exit 3 needs its own grounds); *unknown* = neither. Compiles "
        "count finished compile calls up to the first success of the whole model (AMP retries included and "
        "marked; sharderd's probe, one node compiled alone on one IPU, counts as one; sharderd runs "
        "two at a time by default, so which attempt lands first can move its count by one between runs, and "
        "its cancelled speculative attempts are shown separately; the seed runs one at a time here). slowest/bound = the slowest "
        "stage's predicted time over sharderd's lower bound for N devices (the seed's split costed with "
        'sharderd\'s model; "k/N used" = IPUs the seed left empty). Fake compiles take well under a second, '
        "so wall time here is mostly planning and process start-up; on an IPU host each compile takes minutes.",
        "",
        f"    {command}",
        "",
        machine_markdown(info),
        "",
        feasibility_table(feas),
        "",
        per_truth_table(cells),
        "",
        table(cells),
        "",
        summary(cells),
        "",
    ]
    if found:
        lines += [
            "Where sharderd went wrong (commands rerun the cell from the repository "
            "root after `python bench/compiles.py` built the models):",
            "",
            *[f"- {p}" for p in found],
            "",
        ]
    else:
        lines += [
            "No cell went wrong: no exit 3 where a witness split compiles, a success wherever one does.",
            "",
        ]
    return "\n".join(lines)


def write_section(text: str, path: Path = BENCHMARKS, heading: str = SECTION) -> None:
    """Replace this script's section (or append it); the rest of the file is someone else's."""
    if not path.exists():
        path.write_text("# Benchmarks\n\n" + text)
        return
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        body = "".join(lines)
        path.write_text(
            body + ("" if body.endswith("\n\n") else "\n" if body.endswith("\n") else "\n\n") + text
        )
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + text + ("\n" + tail if tail else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="default truth; transformer and chain")
    parser.add_argument("--models", nargs="*", choices=[m.name for m in MODELS])
    parser.add_argument(
        "--truths", nargs="*", choices=list(TRUTHS), help="these truths only (default: all)"
    )
    parser.add_argument("--parallel", type=int, help="sharderd --parallel (default: its config, 2)")
    parser.add_argument(
        "--write-benchmarks", action="store_true", help=f"(re)write '{SECTION}' in BENCHMARKS.md"
    )
    parser.add_argument(
        "--seed-from",
        type=Path,
        help="reuse the seed's runs from this compiles.json of an earlier run (same cells)",
    )
    parser.add_argument(
        "--from-json",
        action="store_true",
        help=f"render the last run's {WORK.name}/compiles.json again instead of running",
    )
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads((WORK / "compiles.json").read_text())
        cells = [_cell_from_json(c) for c in saved["cells"]]
        feas = {
            m: {t: Feasibility(**f) for t, f in by.items()}
            for m, by in saved["feasibility"].items()
        }
        text = section(cells, feas, saved["command"], problems(cells), saved["machine"])
        print(text)
        if args.write_benchmarks:
            write_section(text)
        return 0
    names = args.models or (["transformer", "chain"] if args.quick else [m.name for m in MODELS])
    models = [m for m in MODELS if m.name in names]
    truths = {"default": TRUTHS["default"]} if args.quick else TRUTHS
    if args.truths:
        truths = {name: TRUTHS[name] for name in args.truths}
    seeds = None
    if args.seed_from is not None:
        saved = json.loads(args.seed_from.read_text())
        seeds = {
            (c["model"], c["truth"], c["devices"]): ToolRun(**c["seed"]) for c in saved["cells"]
        }
    cells, feas = run_matrix(
        models, truths, args.parallel, lambda s: print(s, file=sys.stderr, flush=True), seeds
    )
    found = problems(cells)
    command = "python bench/compiles.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-benchmarks"
    )
    info = machine()
    text = section(cells, feas, command, found, info)
    print(text)
    write_json(
        WORK / "compiles.json",
        {
            "command": command,
            "machine": info,
            "cells": [_cell_json(c) for c in cells],
            "feasibility": {m: {t: _feas_json(f) for t, f in by.items()} for m, by in feas.items()},
            "problems": found,
        },
    )
    if args.write_benchmarks:
        write_section(text)
    return 0


def _cell_json(cell: Cell) -> dict[str, Any]:
    def run(r: ToolRun) -> dict[str, Any]:
        return {k: getattr(r, k) for k in ToolRun.__dataclass_fields__}

    return {
        "model": cell.model,
        "truth": cell.truth,
        "devices": cell.devices,
        "expected": cell.expected,
        "sharderd": run(cell.sharderd),
        "seed": run(cell.seed),
    }


def _feas_json(f: Feasibility) -> dict[str, Any]:
    return {
        "min_fit": f.min_fit,
        "min_fit_lowest_amp": f.min_fit_lowest_amp,
        "proven_below": f.proven_below,
        "node_too_big": f.node_too_big,
    }


def _cell_from_json(data: Mapping[str, Any]) -> Cell:
    return Cell(
        data["model"],
        data["truth"],
        data["devices"],
        data["expected"],
        ToolRun(**data["sharderd"]),
        ToolRun(**data["seed"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
