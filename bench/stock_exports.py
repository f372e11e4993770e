"""Stock, full-size exports of the models users bring, made the way users make them.

Random weights (``torch.manual_seed(0)``, every model built from its config: nothing is downloaded
but the ``rapidocr-onnxruntime`` wheel and ``diffusers``' code), stock ``torch.onnx.export`` as
``export_models.export_torch`` calls it: TorchScript exporter (``dynamo=False``), opset 17, dynamic
batch (and sequence) axes, constant folding, eager attention for transformers. Weights stay inline
under protobuf's 2 GB and go to external data (torch's own layout: one file per tensor beside the
model) over it, exactly as torch writes them. The OCR recogniser is the trained PP-OCRv4 model the
wheel ships. The models and how each is made: ``stock_models.py``.

Each model is exported in a fresh process (``--child``), so one model's memory never adds to the
next and the export's peak RSS is its own. Then, unless ``--no-check``, onnxruntime opens the file
and runs it once at the plan shapes, and ``sharderd plan`` plans it at each ``--devices`` count
(default 4) (``stock_checks.py``). ``OUT/manifest.json`` gets one entry per model (merged, so
``--only`` runs add to it) and ``OUT/PROGRESS.txt`` a line as each model is exported and as its
checks finish.

    python bench/stock_exports.py                     # every model, in --list order
    python bench/stock_exports.py --only gpt2 --only swin_t --out /tmp/stock
    python bench/stock_exports.py --check-only --only gpt2_xl --devices 8 --devices 16
    python bench/stock_exports.py --list
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _common import fmt_bytes, run_measured
from export_models import input_dims
from stock_checks import check_ort, check_plan, tail
from stock_models import BUILDERS, Exported

DEFAULT_OUT = Path("/work/exports/stock")
PLAN_DEVICES = (4,)
"""``--devices`` default: the device counts ``sharderd plan`` is run at."""


# ---------------------------------------------------------------------------------------------
# the manifest entry, the checks


def _constants(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """The tensors of ``Constant`` nodes: paddle2onnx keeps every weight in one."""
    return [
        attr.t
        for node in graph.node
        if node.op_type == "Constant"
        for attr in node.attribute
        if attr.name == "value"
    ]


def describe(name: str, path: Path, exported: Exported) -> dict[str, Any]:
    """Read off the file without its external data: sizes, where the weights are, nodes, inputs."""
    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    locations = sorted(
        {
            entry.value
            for tensor in graph.initializer
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )
    total = path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations)
    shapes = exported.entry.ort_input_shapes
    flags = [
        f"--input-shape {arg}={','.join(map(str, shape))}" for arg, shape in shapes.items()
    ] + list(exported.plan_flags)
    declared = input_dims(model)
    return {
        "file": f"{name}/{path.name}",
        "file_bytes": path.stat().st_size,
        "total_bytes": total,
        "weights": "external" if locations else "inline",
        "external_files": len(locations),
        "nodes": len(graph.node),
        "initializers": len(graph.initializer),
        "params": sum(  # elements of every weight, shape constants included
            int(np.prod(t.dims)) for t in [*graph.initializer, *_constants(graph)]
        ),
        "inputs": {
            arg: {"dims": dims, "plan_shape": shapes[arg]} for arg, dims in declared.items()
        },
        "outputs": [value.name for value in graph.output],
        "sharderd_flags": " ".join(flags),
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "how": exported.entry.how,
        "source": exported.entry.source,
        "notes": exported.entry.notes,
        "category": exported.entry.category,
        "export_seconds": exported.export_seconds,
    }


# ---------------------------------------------------------------------------------------------
# driver


def _write_json_atomic(path: Path, data: Any) -> None:
    """Others poll the manifest while this runs: they see the old file or the new one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


def _progress(out: Path, line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (out / "PROGRESS.txt").open("a") as f:
        f.write(f"{stamp} {line}\n")
    print(line, flush=True)


def _manifest(out: Path) -> dict[str, Any]:
    path = out / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _record(out: Path, name: str, entry: dict[str, Any]) -> None:
    manifest = _manifest(out)
    manifest[name] = entry
    data = {n: manifest[n] for n in sorted(manifest, key=_order)}
    _write_json_atomic(out / "manifest.json", data)


def _order(name: str) -> int:
    return list(BUILDERS).index(name) if name in BUILDERS else len(BUILDERS)


def child(name: str, out: Path) -> None:
    """Export one model into ``out/name/`` (emptied first) and print its manifest entry as JSON."""
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    exported = BUILDERS[name](path)
    print(json.dumps(describe(name, path, exported)))


def export_one(name: str, out: Path) -> dict[str, Any] | None:
    """Export in a fresh process; its manifest entry, or None when the export failed."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
    run = run_measured(argv)
    if run.exit_code != 0:
        _record(out, name, {"export_failed": tail(run.stderr, 30)})
        _progress(out, f"{name}: EXPORT FAILED (exit {run.exit_code}), see manifest.json")
        return None
    entry = json.loads(run.stdout.strip().splitlines()[-1])
    entry |= {
        "export_seconds": round(entry["export_seconds"], 1),
        "export_process_wall_s": round(run.wall_s, 1),
        "export_peak_rss_bytes": run.peak_rss_bytes,
    }
    _record(out, name, entry)
    _progress(
        out,
        f"{name}: exported {out / entry['file']} ({fmt_bytes(entry['total_bytes'])} {entry['weights']}, "
        f"{entry['nodes']} nodes, export {entry['export_seconds']} s); flags: {entry['sharderd_flags']}",
    )
    return entry


def check_one(name: str, out: Path, entry: dict[str, Any], devices: list[int]) -> None:
    path = out / entry["file"]
    entry["ort"] = ort = check_ort(path, {k: v["plan_shape"] for k, v in entry["inputs"].items()})
    lines = [f"ort ran in {ort['run_s']} s" if ort["ok"] else "ORT FAILED"]
    for count in devices:
        entry[f"plan_{count}"] = plan = check_plan(path, count, entry["sharderd_flags"])
        lines.append(
            f"sharderd plan --devices {count} exit {plan['exit_code']} in {plan['wall_s']} s "
            f"wall, {plan['cpu_s']} s CPU, peak {fmt_bytes(plan['peak_rss_bytes'])}"
        )
        _record(out, name, entry)
    _progress(out, f"{name}: checked: {'; '.join(lines)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="export this model (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument(
        "--no-check", action="store_true", help="skip the onnxruntime run and the sharderd plan"
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="do not export: check the models the manifest in --out already lists",
    )
    parser.add_argument(
        "--devices",
        action="append",
        type=int,
        metavar="N",
        help="run sharderd plan at N devices (repeatable; default 4)",
    )
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = args.out.resolve()
    if args.child:
        child(args.child, out)
        return 0
    if args.list:
        for name in BUILDERS:
            print(name)
        return 0
    names = args.only or list(BUILDERS)
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILDERS)}")
    out.mkdir(parents=True, exist_ok=True)
    listed = _manifest(out)
    for name in sorted(names, key=_order):
        if args.check_only and "file" not in listed.get(name, {}):
            parser.error(f"{name} is not exported in {out}: run without --check-only first")
    for name in sorted(names, key=_order):
        entry = _manifest(out)[name] if args.check_only else export_one(name, out)
        if entry is not None and not args.no_check:
            check_one(name, out, entry, args.devices or list(PLAN_DEVICES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
