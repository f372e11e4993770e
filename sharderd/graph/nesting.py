"""How deep a model nests subgraphs (``If``/``Loop``/``Scan`` bodies), refused past a fixed depth.

onnxruntime's symbolic shape inference, which every plan runs (``graph/propagate.py``), infers
the taken branch of an ``If`` whose condition it knows in place of the other one too, so each
level of such nesting doubles its work: for a 2 KB model of one-node branches, 0.18 CPU-seconds at
8 levels, 0.8 at 10, 3.5 at 12 (``bench/nesting.py``), so some 15 CPU-minutes at 20 (docs/shapes.md,
2a). The depth is checked on the parsed proto, before any inference, without recursion.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Final

import onnx

from sharderd.errors import ModelInvalidError

__all__ = ["MAX_SUBGRAPH_DEPTH", "check_nesting", "deepest_nesting", "fold_command"]

MAX_SUBGRAPH_DEPTH: Final = 8
"""Deepest subgraph accepted (a body of a main-graph node is at depth 1). The deepest real export
in tests/data (Silero VAD) nests 3; at 8, a worst case costs the inference 2^8 copies of a branch
(0.18 CPU-seconds for the one-node branches of ``tests/pathological.py``)."""


def fold_command(model: str) -> str:
    """A shell command that writes ``<stem>.folded.onnx`` beside ``model`` with onnxruntime's basic
    optimizations, which replace an ``If`` whose condition is a constant by its branch."""
    folded = str(Path(model).with_suffix(".folded.onnx"))
    code = (
        "import onnxruntime as ort; o = ort.SessionOptions(); "
        "o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC; "
        f"o.optimized_model_filepath = {json.dumps(folded)}; "
        f'ort.InferenceSession({json.dumps(model)}, o, providers=["CPUExecutionProvider"])'
    )
    return f"python3 -c {shlex.quote(code)}"


def deepest_nesting(graph: onnx.GraphProto) -> tuple[int, tuple[str, ...]]:
    """The deepest subgraph's depth and the nodes that hold it, outermost first (``If 'a'``)."""
    best: tuple[int, tuple[str, ...]] = (0, ())
    todo: list[tuple[onnx.GraphProto, tuple[str, ...]]] = [(graph, ())]
    while todo:
        current, path = todo.pop()
        if len(path) > best[0]:
            best = (len(path), path)
        for node in current.node:
            for attr in node.attribute:
                subs = (attr.g,) if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
                for sub in subs:
                    todo.append((sub, (*path, f"{node.op_type} {node.name or '(unnamed)'!r}")))
    return best


def check_nesting(graph: onnx.GraphProto, where: str) -> None:
    """Refuse a model whose subgraphs nest deeper than :data:`MAX_SUBGRAPH_DEPTH` (exit 2)."""
    depth, path = deepest_nesting(graph)
    if depth <= MAX_SUBGRAPH_DEPTH:
        return
    shown = path if depth <= 6 else (*path[:3], "...", *path[-2:])
    raise ModelInvalidError(
        f"{where} nests subgraphs {depth} deep ({' > '.join(shown)}); sharderd accepts at most "
        f"{MAX_SUBGRAPH_DEPTH}: shape inference doubles its work with each level of If whose "
        "condition is known, so such a model could plan for hours",
        hint="If the conditions are constants, onnxruntime folds those branches away; this writes "
        f"the folded model beside it, to shard instead: `{fold_command(where)}`",
    )
