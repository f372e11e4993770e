"""Every real export in tests/data/models, analysed at its manifest input shapes, against onnxruntime.

The oracle (``graph_oracle``) runs each model once with every node output exposed and reads off the
exact shape of every tensor that existed in the run. sharderd's analysis, given the same input
shapes, must leave no tensor of unknown size, agree with every one of those shapes, and count total
FLOPs within ±5% of the same per-op formulas applied to the exact shapes (the nodes the compiler
runs: constant expressions are folded, and cost nothing). A size that depends on
the data is exempt from nothing: the manifest's inputs drive it to its upper bound, so the bound
sharderd plans with must equal what ran, and the analysis must say the tensor is data-dependent.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import onnx
import pytest
from graph_oracle import Oracle, constant_outputs, exact_flops, make_inputs, run_oracle

from sharderd.config import PlanConfig
from sharderd.graph.analyze import Analysis, analyze
from sharderd.graph.load import load_model

MODELS = Path(__file__).resolve().parent.parent / "data" / "models"
MANIFEST: dict[str, dict[str, Any]] = json.loads((MODELS / "manifest.json").read_text())
FLOPS_TOLERANCE = 0.05
KNOWN_GAPS = {
    "silero_vad": "nested If bodies whose outputs the exporter left untyped: neither ONNX's nor "
    "onnxruntime's symbolic inference types /model/If and /model/decoder/If_1, so 15 tensors keep "
    "an unknown size (docs/shapes.md, 'Known gap')",
}


def _models() -> list[Any]:
    """Every manifest model; a known gap is a strict xfail, so closing it fails until it is removed."""
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name]))
        if name in KNOWN_GAPS
        else name
        for name in sorted(MANIFEST)
    ]


@cache
def _analysis(name: str) -> Analysis:
    entry = MANIFEST[name]
    shapes = {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
    config = PlanConfig(input_shapes=shapes, name_nodes=True)
    return analyze(load_model(MODELS / entry["path"]), config)


@cache
def _oracle(name: str) -> Oracle:
    entry = MANIFEST[name]
    model = onnx.load(MODELS / entry["path"])
    feed = make_inputs(
        model,
        entry["ort_input_shapes"],
        values=entry.get("ort_input_values"),
        ranges=entry.get("ort_input_ranges"),
    )
    return run_oracle(model, feed)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_oracle_reproduces_the_manifest_outputs(name: str) -> None:
    """The oracle's inputs and run are the ones the manifest recorded (guards the oracle itself)."""
    oracle = _oracle(name)
    for output, shape in MANIFEST[name]["ort_output_shapes"].items():
        assert oracle.shapes[output] == tuple(shape), output


@pytest.mark.parametrize("name", _models())
def test_no_tensor_of_unknown_size(name: str) -> None:
    assert _analysis(name).costs.unknown_tensors == ()


@pytest.mark.parametrize("name", _models())
def test_every_shape_matches_onnxruntime(name: str) -> None:
    types = _analysis(name).shapes.types
    oracle = _oracle(name)
    wrong = {}
    for tensor, exact in oracle.shapes.items():
        inferred = types.get(tensor)
        got = None if inferred is None else inferred.shape
        if got != exact:
            wrong[tensor] = (got, exact)
    assert not wrong, (
        f"{len(wrong)} of {len(oracle.shapes)} tensors (inferred, exact): {dict(list(wrong.items())[:8])}"
    )


@pytest.mark.parametrize("name", _models())
def test_total_flops_match_the_exact_count(name: str) -> None:
    """The compiled nodes' FLOPs against the same formulas on the shapes that ran, without the
    constant expressions the compiler folds (counted independently: ``constant_outputs``)."""
    oracle = _oracle(name)
    model = onnx.load(MODELS / MANIFEST[name]["path"], load_external_data=False)
    exact = exact_flops(oracle, set(constant_outputs(model, set(oracle.shapes))))
    total = _analysis(name).total_flops
    assert exact > 0
    assert abs(total - exact) <= FLOPS_TOLERANCE * exact, (
        f"sharderd {total:.4g} vs exact {exact:.4g}"
    )


@pytest.mark.parametrize(
    "name", sorted(n for n, e in MANIFEST.items() if e.get("data_dependent_tensors"))
)
def test_data_dependent_sizes_are_reported(name: str) -> None:
    reported = {d.tensor: d for d in _analysis(name).shapes.data_dependent}
    expected = MANIFEST[name]["data_dependent_tensors"]
    assert set(expected) <= set(reported), f"not reported: {sorted(set(expected) - set(reported))}"
    assert all(reported[t].costed_as for t in expected)
