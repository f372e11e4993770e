"""`sharderd plan` on the large graphs of issue 36, CPU and peak RSS of the child, for one or more
sharderd installs measured alternately in one sitting (a main checkout's venv and this one).

- the GPT-2-XL-sized exporter graph (``exporter_graph.py --layers 48 --hidden 1600 --heads 25
  --vocab 50257 --external``, 9,325 nodes, 6.55 GB sparse external data), 16 × ipu-mk2,
  ``--dim sequence=128``, with and without ``--no-serialize``;
- torchvision ``swin_s`` and ``swin_t`` at full size (random weights, exported as
  ``export_models.py`` exports: TorchScript exporter, opset 17, dynamic batch/height/width),
  4 × ipu-mk2 at ``pixel_values=1,3,224,224``;
- with ``--stock-xl PATH``, a real ``torch.onnx.export`` of Hugging Face GPT-2 XL (inputs
  ``input_ids``/``attention_mask``), 16 × ipu-mk2 at sequence 128, with and without serializing;
- tests/data/models/gpt_decoder on 2 devices: start-up and a small model's plan;
- with ``--stock DIR`` (``bench/stock_exports.py``'s folder, default ``/work/exports/stock``), the
  stock exports there at their manifest's ``sharderd_flags``: GPT-2 XL on 16 devices with and
  without ``--no-serialize``, ``swin_s`` and ``swin_t`` on 4 and 8 devices, in place of the
  synthetic XL and the swin re-exports.

Models are made once under ``bench/out/real_plans/`` (or given with ``--xl``/``--swin-s``/
``--swin-t``); the swin exports need torchvision. Every case runs ``--repeat`` times, the
executables alternating within each round; the table gives medians. An executable may be named
``NAME=PATH``. Last come issue 36's targets on these cases: GPT-2 XL's CPU and peak RSS within
1.2x of ``--no-serialize``'s, ``swin_s`` planned in at most 10 s CPU.

    python bench/real_plans.py --sharderd /work/wt/shapes-base/.venv/bin/sharderd .venv/bin/sharderd
    python bench/real_plans.py --stock /work/exports/stock --repeat 3 \
        --sharderd before=/work/wt/bench36-base/.venv/bin/sharderd after=.venv/bin/sharderd
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from _common import OUT, Run, machine, machine_markdown, markdown_table, run_measured, write_json

HERE = Path(__file__).resolve().parent
MODELS = OUT / "real_plans"
SERIALIZE_RATIO = 1.2
"""Issue 36: a plan of GPT-2 XL costs at most this times its ``--no-serialize`` plan (CPU, RSS)."""
SWIN_S_CPU_S = 10.0
"""Issue 36: torchvision ``swin_s`` plans in at most this many CPU seconds."""


def _xl() -> Path:
    path = MODELS / "gpt2_xl.onnx"
    if not path.exists():
        MODELS.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, str(HERE / "exporter_graph.py"), str(path), "--layers", "48",
                "--hidden", "1600", "--heads", "25", "--vocab", "50257", "--external"]  # fmt: skip
        subprocess.run(argv, check=True)
    return path


_EXPORT = """
import sys, torch, torchvision
name, path = sys.argv[1:]
torch.manual_seed(0)
model = getattr(torchvision.models, name)(weights=None).eval()
with torch.no_grad():
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), path, dynamo=False, opset_version=17,
        input_names=["pixel_values"], output_names=["logits"], do_constant_folding=True,
        dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}})
"""


def _torchvision(name: str) -> Path:
    path = MODELS / f"{name}.onnx"
    if not path.exists():
        MODELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", _EXPORT, name, str(path)], check=True)
    return path


def _stock_cases(stock: Path) -> list[tuple[str, list[str]]]:
    manifest = json.loads((stock / "manifest.json").read_text())

    def plan(name: str, devices: int) -> list[str]:
        flags = shlex.split(manifest[name]["sharderd_flags"])
        return ["plan", str(stock / manifest[name]["file"]), "--devices", str(devices), *flags]

    xl = [*plan("gpt2_xl", 16), "--json"]
    cases = [
        ("stock GPT-2 XL, serialize on", xl),
        ("stock GPT-2 XL, --no-serialize", [*xl, "--no-serialize"]),
    ]
    for name in ("swin_s", "swin_t"):
        cases += [(f"stock {name} × {n}", [*plan(name, n), "--json"]) for n in (4, 8)]
    return cases


def _cases(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    if args.stock:
        return _stock_cases(args.stock)
    xl = str(args.xl or _xl())
    common = ["--devices", "16", "--dim", "sequence=128", "--json"]
    vision = ["--devices", "4", "--input-shape", "pixel_values=1,3,224,224", "--json"]
    text = ["--input-shape", "input_ids=1,128", "--input-shape", "attention_mask=1,128"]
    decoder = str(HERE.parent / "tests" / "data" / "models" / "gpt_decoder" / "model.onnx")
    cases = [
        ("GPT-2 XL, serialize on", ["plan", xl, *common]),
        ("GPT-2 XL, --no-serialize", ["plan", xl, *common, "--no-serialize"]),
        ("swin_s", ["plan", str(args.swin_s or _torchvision("swin_s")), *vision]),
        ("swin_t", ["plan", str(args.swin_t or _torchvision("swin_t")), *vision]),
        ("gpt_decoder", ["plan", decoder, "--devices", "2", *text, "--json"]),
    ]
    if args.stock_xl:
        stock = ["plan", str(args.stock_xl), "--devices", "16", *text, "--json"]
        cases += [
            ("stock GPT-2 XL, serialize on", stock),
            ("stock GPT-2 XL, --no-serialize", [*stock, "--no-serialize"]),
        ]
    return cases


def _facts(stdout: str) -> str:
    try:
        report = json.loads(stdout)
    except ValueError:
        return "no report"
    model, tried = report.get("model", {}), report.get("serialization_tried") or []
    plan = report.get("plan") or {}
    if "bottleneck_s" not in plan:
        return f"status {report.get('status')}"
    facts = [
        f"{model.get('nodes')} nodes",
        f"unknown {model.get('unknown_size_tensors', '?')}",
        f"{model.get('flops', 0) / 1e9:.2f} GFLOP",
        f"bottleneck {plan['bottleneck_s'] * 1e6:.1f} µs",
    ]
    if tried:
        facts.append(f"tried {'kept' if tried[0]['kept'] else 'not kept'}")
    return ", ".join(facts)


def _verdicts(runs: dict[tuple[str, str], list[Run]], exes: list[str]) -> list[str]:
    """Issue 36's targets, on the medians of the cases that ran."""

    def median(case: str, exe: str) -> tuple[float, float] | None:
        done = runs.get((case, exe))
        if not done or any(r.exit_code for r in done):
            return None
        cpu = statistics.median(r.user_s + r.sys_s for r in done)
        return cpu, statistics.median(r.peak_rss_bytes / 2**20 for r in done)

    lines = []
    for exe in exes:
        for prefix in ("", "stock "):
            on = median(f"{prefix}GPT-2 XL, serialize on", exe)
            off = median(f"{prefix}GPT-2 XL, --no-serialize", exe)
            if on and off:
                ok = on[0] <= SERIALIZE_RATIO * off[0] and on[1] <= SERIALIZE_RATIO * off[1]
                lines.append(
                    f"{exe}: {prefix}GPT-2 XL: {on[0]:.2f} s CPU = {on[0] / off[0]:.2f}x and "
                    f"{on[1]:.0f} MiB = {on[1] / off[1]:.2f}x --no-serialize's {off[0]:.2f} s, "
                    f"{off[1]:.0f} MiB (target <= {SERIALIZE_RATIO}x both): "
                    f"{'holds' if ok else 'MISSED'}"
                )
        for case in dict.fromkeys(case for case, _ in runs):
            if "swin_s" in case and (got := median(case, exe)):
                lines.append(
                    f"{exe}: {case}: {got[0]:.2f} s CPU (target <= {SWIN_S_CPU_S:.0f} s): "
                    f"{'holds' if got[0] <= SWIN_S_CPU_S else 'MISSED'}"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sharderd", nargs="+", default=["sharderd"], help="executables to compare"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--xl", type=Path)
    parser.add_argument("--swin-s", type=Path)
    parser.add_argument("--swin-t", type=Path)
    parser.add_argument("--stock-xl", type=Path, help="a torch.onnx.export of HF GPT-2 XL")
    parser.add_argument(
        "--stock",
        type=Path,
        nargs="?",
        const=Path("/work/exports/stock"),
        help="plan bench/stock_exports.py's exports instead (default folder /work/exports/stock)",
    )
    parser.add_argument("--json-out", type=Path, help="raw results (default: none)")
    parser.add_argument("--only", nargs="*", help="case names to run")
    args = parser.parse_args()
    cases = [c for c in _cases(args) if not args.only or any(o == c[0] for o in args.only)]
    exes = dict(e.split("=", 1) if "=" in e else (e, e) for e in args.sharderd)
    runs: dict[tuple[str, str], list[Run]] = {}
    for round_ in range(args.repeat):
        for name, argv in cases:
            for label, exe in exes.items():  # alternate installs within each case and round
                run = run_measured([exe, *argv])
                runs.setdefault((name, label), []).append(run)
                print(
                    f"round {round_ + 1}: {name:34} {label:8} exit {run.exit_code} "
                    f"{run.user_s + run.sys_s:7.2f} s CPU {run.wall_s:7.1f} s wall "
                    f"{run.peak_rss_bytes / 2**20:6.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
    if args.json_out:
        raw = [
            {"case": name, "sharderd": label, "argv": list(r.argv), "exit_code": r.exit_code,
             "wall_s": r.wall_s, "cpu_s": r.user_s + r.sys_s, "peak_rss_bytes": r.peak_rss_bytes,
             "report": _facts(r.stdout)}
            for (name, label), done in runs.items() for r in done
        ]  # fmt: skip
        write_json(args.json_out, {"machine": machine(), "repeat": args.repeat, "runs": raw})
    rows = []
    for (name, exe), done in runs.items():
        cpu = [r.user_s + r.sys_s for r in done]
        rss = [r.peak_rss_bytes / 2**20 for r in done]
        rows.append([
            name, exe, ", ".join(str(r.exit_code) for r in done),
            f"{statistics.median(cpu):.2f} ({min(cpu):.2f}–{max(cpu):.2f})",
            f"{statistics.median(rss):.0f}", f"{statistics.median(r.wall_s for r in done):.1f}",
            _facts(done[-1].stdout),
        ])  # fmt: skip
    header = [
        "case",
        "sharderd",
        "exit",
        "CPU s median (min–max)",
        "peak RSS MiB",
        "wall s",
        "report",
    ]
    print(markdown_table(header, rows))
    print()
    print(machine_markdown(machine()))
    print()
    for line in _verdicts(runs, list(exes)):
        print(f"- {line}")


if __name__ == "__main__":
    main()
