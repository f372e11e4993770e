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
- tests/data/models/gpt_decoder on 2 devices: start-up and a small model's plan.

Models are made once under ``bench/out/real_plans/`` (or given with ``--xl``/``--swin-s``/
``--swin-t``); the swin exports need torchvision.

    python bench/real_plans.py --sharderd /work/wt/shapes-base/.venv/bin/sharderd .venv/bin/sharderd
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _common import OUT, machine, machine_markdown, markdown_table, run_measured

HERE = Path(__file__).resolve().parent
MODELS = OUT / "real_plans"


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


def _cases(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
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
    model, tried = report["model"], report.get("serialization_tried") or []
    facts = [
        f"{model['nodes']} nodes",
        f"unknown {model['unknown_size_tensors']}",
        f"{model['flops'] / 1e9:.2f} GFLOP",
        f"bottleneck {report['plan']['bottleneck_s'] * 1e6:.1f} µs",
    ]
    if tried:
        facts.append(f"tried {'kept' if tried[0]['kept'] else 'not kept'}")
    return ", ".join(facts)


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
    parser.add_argument("--only", nargs="*", help="case names to run")
    args = parser.parse_args()
    cases = [c for c in _cases(args) if not args.only or any(o == c[0] for o in args.only)]
    runs: dict[tuple[str, str], list] = {}
    for _ in range(args.repeat):
        for name, argv in cases:
            for exe in args.sharderd:  # alternate installs within each case and round
                runs.setdefault((name, exe), []).append(run_measured([exe, *argv]))
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


if __name__ == "__main__":
    main()
