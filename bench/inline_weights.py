"""Plan and shard stock exports whose weights are inline, against their external-data copies.

For each model (a ``torch.onnx.export`` under 2 GB, weights inline in the ``.onnx``) and its copy
saved with external data, runs with each given sharderd executable (e.g. main and a branch, in one
sitting):

- ``sharderd plan MODEL --devices N --json`` with and without ``--no-serialize``;
- ``sharderd shard MODEL --devices N --backend none --quiet --out DIR`` likewise,

each a fresh process measured by ``wait4`` (``_common.run_measured``): wall, user + sys CPU, peak
RSS. With ``--repeat N`` every cell runs N times, the executables alternating within each round
(so load on a shared machine falls on both alike), and the table gives each figure's median. The
shard outputs of the executables are compared by SHA-256 (model, YAML and data files; every run's
must agree), so the table also says whether a change altered what users get.

    python bench/inline_weights.py --exe before=/work/wt/weights-base/.venv/bin/sharderd \
        --exe after=.venv/bin/sharderd --repeat 3

``--hide-torch`` is a diagnostic, not a user's setup: each command runs with ``torch`` made
unimportable, to show what importing it costs (onnxruntime's ``onnxruntime.tools`` package, which
holds the symbolic shape inference, imports torch whenever it is installed).

The stock exports come from ``/work/exports/stock`` (``manifest.json`` there gives each model's
``sharderd_flags``); ``--make-external`` writes the external-data copies (``onnx.save`` with
``save_as_external_data``; it holds the model in memory once) under ``--external``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import (  # bench/ is not a package: python puts this folder on sys.path
    OUT,
    Run,
    machine,
    machine_markdown,
    markdown_table,
    run_measured,
    write_json,
)

MODELS = ("gpt2_medium", "bert_large", "gpt2")
DEVICES = 8
_HIDE_TORCH = (
    "import sys; sys.modules['torch'] = None; from sharderd.cli import main; "
    "raise SystemExit(main(sys.argv[1:]))"
)
PLAN_RSS_CAP = 400 * 2**20
SHARD_RSS_CAP = 600 * 2**20
PLAN_RSS_RATIO = 1.3
SHARD_WALL_RATIO = 1.5
"""Issue 36's targets for GPT-2 medium inline, against its external-data copy."""


@dataclass(frozen=True, slots=True)
class Cell:
    model: str
    form: str
    """``inline`` or ``external``."""
    exe: str
    command: str
    serialize: bool
    run: Run
    outputs: dict[str, str] | None
    """Shard only: output file name → SHA-256."""

    @property
    def key(self) -> tuple[str, str, str, str, bool]:
        return (self.model, self.form, self.exe, self.command, self.serialize)


@dataclass(frozen=True, slots=True)
class Median:
    """The runs of one cell: each figure's median, and whether every run wrote the same files."""

    cell: Cell
    """The first run (model, form, executable, command)."""
    runs: int
    exit_codes: tuple[int, ...]
    wall_s: float
    cpu_s: float
    sys_s: float
    peak_rss_bytes: float
    outputs: dict[str, str] | None
    """The shard outputs' digests when every run's agree, else None."""
    outputs_stable: bool


def medians(cells: list[Cell]) -> list[Median]:
    groups: dict[tuple[str, str, str, str, bool], list[Cell]] = {}
    for c in cells:
        groups.setdefault(c.key, []).append(c)
    out = []
    for group in groups.values():
        runs = [c.run for c in group]
        digests = [c.outputs for c in group]
        stable = all(d == digests[0] for d in digests)
        out.append(
            Median(
                cell=group[0],
                runs=len(group),
                exit_codes=tuple(r.exit_code for r in runs),
                wall_s=statistics.median(r.wall_s for r in runs),
                cpu_s=statistics.median(r.user_s + r.sys_s for r in runs),
                sys_s=statistics.median(r.sys_s for r in runs),
                peak_rss_bytes=statistics.median(r.peak_rss_bytes for r in runs),
                outputs=digests[0] if stable else None,
                outputs_stable=stable,
            )
        )
    return out


def make_external(inline: Path, folder: Path) -> Path:
    import onnx

    out = folder / "model.onnx"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        model = onnx.load(str(inline))
        onnx.save(
            model,
            str(out),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.data",
            size_threshold=1024,
        )
    return out


def _digests(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("report."):
            continue  # timings differ run to run
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        out[path.name] = digest.hexdigest()
    return out


def measure(
    exe: tuple[str, str],
    model: str,
    form: str,
    path: Path,
    flags: list[str],
    scratch: Path,
    *,
    commands: tuple[str, ...] = ("plan", "shard"),
    hide_torch: bool = False,
) -> list[Cell]:
    cells = []
    head = [str(Path(exe[1]).parent / "python"), "-c", _HIDE_TORCH] if hide_torch else [exe[1]]
    for serialize in (True, False):
        extra = [] if serialize else ["--no-serialize"]
        if "plan" in commands:
            argv = [*head, "plan", str(path), "--devices", str(DEVICES), "--json", *flags, *extra]
            cells.append(Cell(model, form, exe[0], "plan", serialize, run_measured(argv), None))
            _say(cells[-1])
        if "shard" not in commands:
            continue
        out = scratch / f"{model}-{form}-{exe[0]}-{serialize}"
        argv = [*head, "shard", str(path), "--devices", str(DEVICES), "--backend", "none"]
        argv += ["--quiet", "--out", str(out), *flags, *extra]
        run = run_measured(argv)
        digests = _digests(out) if out.is_dir() else None
        shutil.rmtree(out, ignore_errors=True)
        cells.append(Cell(model, form, exe[0], "shard", serialize, run, digests))
        _say(cells[-1])
    return cells


def _say(cell: Cell) -> None:
    r = cell.run
    print(
        f"  {cell.exe:8} {cell.model:12} {cell.form:8} {cell.command:5} "
        f"{'serialize' if cell.serialize else 'no-serialize':12} exit {r.exit_code}  "
        f"{r.wall_s:6.1f} s wall  {r.user_s + r.sys_s:6.1f} s CPU ({r.sys_s:.1f} sys)  "
        f"{r.peak_rss_bytes / 2**20:7.0f} MiB",
        file=sys.stderr,
        flush=True,
    )
    if r.exit_code:
        print(r.stderr[-2000:], file=sys.stderr)


def table(rows_in: list[Median]) -> str:
    first = rows_in[0].cell.exe
    reference = {
        (m.cell.model, m.cell.form, m.cell.command, m.cell.serialize): m.outputs
        for m in rows_in
        if m.outputs is not None and m.cell.exe == first
    }
    rows = []
    for m in rows_in:
        c = m.cell
        same = ""
        if c.command == "shard" and not m.outputs_stable:
            same = "runs differ"
        elif m.outputs is not None and c.exe != first:
            ref = reference.get((c.model, c.form, c.command, c.serialize))
            same = "yes" if ref == m.outputs else "NO"
        codes = sorted(set(m.exit_codes))
        rows.append(
            [
                c.model,
                c.form,
                c.exe,
                f"{c.command}{'' if c.serialize else ' --no-serialize'}",
                ", ".join(str(code) for code in codes),
                m.runs,
                f"{m.wall_s:.1f}",
                f"{m.cpu_s:.1f} ({m.sys_s:.1f})",
                f"{m.peak_rss_bytes / 2**20:.0f}",
                same,
            ]
        )
    header = [
        "model",
        "weights",
        "sharderd",
        "command",
        "exit",
        "runs",
        "wall s",
        "CPU s (sys)",
        "peak RSS MiB",
    ]
    return markdown_table([*header, f"outputs as {first}'s"], rows)


def verdicts(cells: list[Median], exe: str) -> list[str]:
    """Issue 36's targets, for GPT-2 medium under ``exe``, on the medians."""

    def cell(form: str, command: str, serialize: bool) -> Median | None:
        return next(
            (m for m in cells if m.cell.key == ("gpt2_medium", form, exe, command, serialize)),
            None,
        )

    lines = []
    for serialize in (True, False):
        label = "" if serialize else " --no-serialize"
        plan_in, plan_ext = cell("inline", "plan", serialize), cell("external", "plan", serialize)
        if plan_in and plan_ext:
            rss, ref = plan_in.peak_rss_bytes, plan_ext.peak_rss_bytes
            ok = rss <= PLAN_RSS_RATIO * ref and rss <= PLAN_RSS_CAP
            lines.append(
                f"plan{label}: inline {rss / 2**20:.0f} MiB = {rss / ref:.2f}x the external copy's "
                f"{ref / 2**20:.0f} MiB (target <= {PLAN_RSS_RATIO}x and <= 400 MiB): {'holds' if ok else 'MISSED'}"
            )
        shard_in, shard_ext = (
            cell("inline", "shard", serialize),
            cell("external", "shard", serialize),
        )
        if shard_in and shard_ext:
            rss, wall, ref = shard_in.peak_rss_bytes, shard_in.wall_s, shard_ext.wall_s
            ok = rss <= SHARD_RSS_CAP and wall <= SHARD_WALL_RATIO * ref
            lines.append(
                f"shard{label}: inline {rss / 2**20:.0f} MiB (target <= 600 MiB), {wall:.1f} s wall = "
                f"{wall / ref:.2f}x the external copy's {ref:.1f} s (target <= {SHARD_WALL_RATIO}x): "
                f"{'holds' if ok else 'MISSED'}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--exe", action="append", required=True, help="NAME=PATH of a sharderd, repeatable"
    )
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--stock", type=Path, default=Path("/work/exports/stock"))
    parser.add_argument("--external", type=Path, default=Path("/work/exports/weights"))
    parser.add_argument("--make-external", action="store_true")
    parser.add_argument("--hide-torch", action="store_true", help="diagnostic: torch unimportable")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; medians reported")
    parser.add_argument(
        "--commands", nargs="+", choices=("plan", "shard"), default=["plan", "shard"]
    )
    parser.add_argument("--json-out", type=Path, help="raw results (default bench/out/...)")
    args = parser.parse_args()
    exes = [tuple(e.split("=", 1)) for e in args.exe]
    manifest = json.loads((args.stock / "manifest.json").read_text())
    cells: list[Cell] = []
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT, prefix="inline-weights-") as tmp:
        for round_ in range(args.repeat):
            for model in args.models:
                inline = args.stock / manifest[model]["file"]
                folder = args.external / f"{model}_external"
                external = (
                    make_external(inline, folder) if args.make_external else folder / "model.onnx"
                )
                flags = shlex.split(manifest[model]["sharderd_flags"])
                for form, path in (("inline", inline), ("external", external)):
                    for exe in exes:  # alternate installs within each model, form and round
                        print(f"round {round_ + 1}/{args.repeat}", file=sys.stderr)
                        cells += measure(
                            exe,
                            model,
                            form,
                            path,
                            flags,
                            Path(tmp),
                            commands=tuple(args.commands),
                            hide_torch=args.hide_torch,
                        )
    info = machine()
    raw = [
        {**asdict(c), "run": {**asdict(c.run), "stdout": "", "stderr": c.run.stderr[-2000:]}}
        for c in cells
    ]
    name = "inline_weights_no_torch.json" if args.hide_torch else "inline_weights.json"
    write_json(
        args.json_out or OUT / name,
        {"machine": info, "hide_torch": args.hide_torch, "repeat": args.repeat, "cells": raw},
    )
    summary = medians(cells)
    print(machine_markdown(info))
    print()
    print(table(summary))
    print()
    for name, _ in exes:
        for line in verdicts(summary, name):
            print(f"- {name}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
