"""Shape inference engines on real exports: how many tensors stay unknown, and how long it takes.

Three ways to size every tensor, on every model in tests/data/models at the manifest's input shapes
(and any ``--extra PATH`` at ``--extra-shape``): ONNX's own whole-model inference with data
propagation (sharderd before issue 10); onnxruntime's symbolic shape inference plus one round of
constant evaluation (sharderd from issue 10 to 36); and what ``sharderd.graph.shapes.shape_info``
does now, the fixed point of graph/fixed_point.py with the symbolic engine only for what it leaves.
All run on the same weight-free copy with the same fixed inputs; the time is the median of
``--runs`` runs in this process (imports excluded).

    python3 bench/shape_engines.py            # prints a Markdown table for docs/shapes.md
    python3 bench/shape_engines.py --runs 1 --extra /work/exports/shapes/swin_s.onnx
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import onnx

from sharderd.graph.evaluate import constant_values, with_values
from sharderd.graph.input_dims import fix_input_dims, graph_inputs
from sharderd.graph.load import load_model
from sharderd.graph.propagate import (
    collect_types,
    inference_copy,
    onnx_inference,
    propagate_shapes,
)
from sharderd.graph.shapes import shape_info

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "models"


def fixed_inputs(model: onnx.ModelProto, shapes: Mapping[str, list[int]]) -> onnx.ModelProto:
    """A shape-inference copy of ``model`` with its real inputs fixed to ``shapes`` (batch 1)."""
    light = inference_copy(model)
    real = {v.name for v in graph_inputs(model.graph)}
    fix_input_dims(
        light.graph,
        batch_size=1,
        dims={},
        input_shapes={k: tuple(v) for k, v in shapes.items()},
        only=real,
    )
    return light


def _unknown(model: onnx.ModelProto, types: Mapping) -> int:
    produced = [o for n in model.graph.node for o in n.output if o]
    return sum(1 for name in produced if name not in types or types[name].shape is None)


def median_s(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def symbolic_then_constants(light: onnx.ModelProto) -> dict:
    """What shape_info did from issue 10 to 36: symbolic inference, then, if tensors stayed
    unknown, one round of constant evaluation and symbolic inference again."""
    first = propagate_shapes(light)
    if not _unknown(light, first.types):
        return dict(first.types)
    opset = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = constant_values(light.graph, first.types, opset)
    again = propagate_shapes(with_values(light, values))
    types = {**again.types}
    for name in values:
        types.setdefault(name, first.types.get(name))
    return types if _unknown(light, types) < _unknown(light, first.types) else dict(first.types)


def _row(name: str, model: onnx.ModelProto, shapes: Mapping[str, list[int]], runs: int) -> str:
    light = fixed_inputs(model, shapes)
    given = {k: tuple(v) for k, v in shapes.items()}

    def now() -> object:
        return shape_info(model, batch_size=1, dims={}, input_shapes=given)

    info = now()
    onnx_types = collect_types(onnx_inference(light).graph)
    before = symbolic_then_constants(light)
    cells = [
        name,
        len(model.graph.node),
        _unknown(model, onnx_types),
        _unknown(model, before),
        _unknown(model, info.types),
        info.rounds,
        info.engine,
        f"{median_s(lambda: onnx_inference(light), runs) * 1e3:.0f}",
        f"{median_s(lambda: symbolic_then_constants(light), runs) * 1e3:.0f}",
        f"{median_s(now, runs) * 1e3:.0f}",
    ]
    return "| " + " | ".join(map(str, cells)) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", nargs="*", help="manifest models (default: all)")
    parser.add_argument("--extra", nargs="*", type=Path, default=[], help="more .onnx files")
    parser.add_argument("--extra-shape", default="pixel_values=1,3,224,224")
    args = parser.parse_args()
    manifest = json.loads((DATA / "manifest.json").read_text())
    print(
        "| model | nodes | unknown: onnx | symbolic + 1 round | sharderd | rounds | engine "
        "| onnx ms | symbolic + 1 round ms | sharderd ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for name in args.models if args.models is not None else sorted(manifest):
        entry = manifest[name]
        model = load_model(DATA / entry["path"]).model
        print(_row(name, model, entry["ort_input_shapes"], args.runs), flush=True)
    key, dims = args.extra_shape.split("=")
    for path in args.extra:
        model = load_model(path).model
        print(
            _row(path.name, model, {key: [int(d) for d in dims.split(",")]}, args.runs), flush=True
        )


if __name__ == "__main__":
    main()
