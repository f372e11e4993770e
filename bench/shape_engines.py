"""Shape inference engines on real exports: how many tensors stay unknown, and how long it takes.

Compares what sharderd used before (ONNX's own inference with data propagation) with what it uses
now (onnxruntime's symbolic shape inference, driven by ``sharderd.graph.propagate``), on every model
in tests/data/models at the manifest's input shapes. Both run on the same weight-free copy with the
same fixed inputs; the time is the median of 5 runs in this process (imports excluded).

    python3 bench/shape_engines.py            # prints a Markdown table for BENCHMARKS.md
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import onnx

from sharderd.graph.input_dims import fix_input_dims, graph_inputs
from sharderd.graph.load import load_model
from sharderd.graph.propagate import (
    _onnx_inference,
    collect_types,
    inference_copy,
    propagate_shapes,
)

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


def _unknown(model: onnx.ModelProto, types: dict) -> int:
    produced = [o for n in model.graph.node for o in n.output if o]
    return sum(1 for name in produced if name not in types or types[name].shape is None)


def median_s(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    manifest = json.loads((DATA / "manifest.json").read_text())
    propagate_shapes(
        fixed_inputs(
            load_model(DATA / "tiny_vit" / "model.onnx").model, {"pixel_values": [1, 3, 224, 224]}
        )
    )
    rows = []
    for name, entry in manifest.items():
        model = load_model(DATA / entry["path"]).model
        light = fixed_inputs(model, entry["ort_input_shapes"])
        onnx_types = collect_types(_onnx_inference(light).graph)
        ssi = propagate_shapes(light)
        rows.append(
            (
                name,
                len(model.graph.node),
                _unknown(model, onnx_types),
                _unknown(model, ssi.types),
                median_s(lambda light=light: _onnx_inference(light)),
                median_s(lambda light=light: propagate_shapes(light)),
                ssi.engine,
            )
        )
    print(
        "| model | nodes | unknown (onnx, data_prop) | unknown (sharderd) | onnx ms | sharderd ms | engine |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, nodes, before, after, t_onnx, t_ssi, engine in rows:
        print(
            f"| {name} | {nodes} | {before} | {after} | {t_onnx * 1e3:.1f} | {t_ssi * 1e3:.1f} | {engine} |"
        )


if __name__ == "__main__":
    main()
