"""Do two sharderd installs write the same files? Shard every real export with each, compare.

Runs ``sharderd shard --backend none`` (fp32 and ``--precision fp16``) on every model of
``tests/data/models`` (or ``--models`` folders / files) with two executables, and compares what they
wrote: the sharded model and its data files byte for byte, the YAML, and report.json less its
timings; ``--external`` also shards a copy of each saved with external data. Made to show that
reading weights where they lie (issue 36) changed no output.

    python bench/inline_identity.py --before /work/wt/weights-base/.venv/bin/sharderd \
        --after .venv/bin/sharderd
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "tests" / "data" / "models"


def _shapes(name: str) -> list[str]:
    manifest = json.loads((MODELS / "manifest.json").read_text())
    entry = manifest.get(name, {})
    flags = ["--name-nodes"]  # ppocr_cls's nodes have no names
    for value, shape in entry.get("ort_input_shapes", {}).items():
        flags += ["--input-shape", f"{value}={','.join(map(str, shape))}"]
    return flags


def _run(exe: str, model: Path, out: Path, extra: list[str], flags: list[str]) -> int:
    argv = [exe, "shard", str(model), "-n", "2", "-b", "none", "-o", str(out), "-q", *flags, *extra]
    return subprocess.run(argv, capture_output=True, text=True, check=False).returncode


def _report(path: Path) -> Any:
    """report.json less what differs run to run: ``created``, every ``timings_s``, the model's path."""
    report = json.loads(path.read_text())
    report.get("model", {}).pop("path", None)
    return _untimed(report)


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("timings_s", "created")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def compare(before: Path, after: Path) -> list[str]:
    """What differs between two output folders (files by name; report.json less its timings)."""
    names = {p.name for p in before.iterdir()} | {p.name for p in after.iterdir()}
    problems = []
    for name in sorted(names):
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            problems.append(f"{name}: only {'after' if b.exists() else 'before'}")
        elif name == "report.json":
            if _report(a) != _report(b):
                problems.append("report.json differs")
        elif name.endswith((".md", ".html")):
            continue  # renderings of report.json, with its timings
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"{name}: bytes differ ({a.stat().st_size} vs {b.stat().st_size})")
    return problems


def _external_copy(model: Path, folder: Path) -> Path:
    import onnx

    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save(onnx.load(str(model)), str(path), save_as_external_data=True, location="model.data")
    return path


def _case(label: str, model: Path, flags: list[str], before: str, after: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / "before", Path(tmp) / "after"]
        codes = [
            _run(exe, model, out, [], flags) for exe, out in zip((before, after), outs, strict=True)
        ]
        if codes[0] != codes[1]:
            problems = [f"exit {codes[0]} before, {codes[1]} after"]
        else:
            problems = compare(*outs) if outs[0].exists() else []
        files = sorted(p.name for p in outs[1].iterdir()) if outs[1].exists() else []
    verdict = (
        "DIFFERS: " + "; ".join(problems)
        if problems
        else f"same (exit {codes[0]}, {len(files)} files)"
    )
    print(f"{label:50} {verdict}", flush=True)
    return bool(problems)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="sharderd executable, the reference")
    parser.add_argument("--after", required=True, help="sharderd executable under test")
    parser.add_argument(
        "--models", nargs="*", type=Path, help="model files (default: the real exports)"
    )
    parser.add_argument(
        "--flag", action="append", default=[], help="extra flag for both, repeatable"
    )
    parser.add_argument("--external", action="store_true", help="also their external-data copies")
    args = parser.parse_args()
    models = args.models or sorted(MODELS.glob("*/model.onnx"))
    failures = 0
    with tempfile.TemporaryDirectory() as copies:
        for model in models:
            flags = _shapes(model.parent.name) + args.flag
            forms = [("", model)]
            if args.external:
                forms.append(("external ", _external_copy(model, Path(copies) / model.parent.name)))
            for form, path in forms:
                for extra in ([], ["--precision", "fp16"]):
                    label = f"{model.parent.name} {form}{' '.join(extra) or 'fp32'}"
                    failures += _case(label, path, flags + extra, args.before, args.after)
    print(f"{failures} case(s) differ", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
