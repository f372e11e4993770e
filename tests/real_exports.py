"""The real exporter outputs in tests/data/models, analysed at their manifest's ORT shapes."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from sharderd.config import PlanConfig
from sharderd.graph.analyze import Analysis, analyze
from sharderd.graph.load import load_model

MODELS = Path(__file__).resolve().parent / "data" / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())


@cache
def export_analysis(name: str) -> Analysis:
    entry = MANIFEST[name]
    shapes = {k: tuple(v) for k, v in entry["ort_input_shapes"].items()}
    return analyze(
        load_model(MODELS / entry["path"]), PlanConfig(input_shapes=shapes, name_nodes=True)
    )
