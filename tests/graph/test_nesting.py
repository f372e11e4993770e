"""Subgraph nesting past ``MAX_SUBGRAPH_DEPTH`` is exit 2 before any shape inference, and the hint
it prints (onnxruntime folding the constant branches away) works as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from pathological import nested_if

from sharderd.errors import EXIT_BAD_INPUT, ModelInvalidError
from sharderd.graph.load import load_model
from sharderd.graph.nesting import MAX_SUBGRAPH_DEPTH, deepest_nesting


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def test_the_deepest_accepted_model_loads_and_one_level_more_is_refused(tmp_path: Path) -> None:
    inside = _save(nested_if(MAX_SUBGRAPH_DEPTH), tmp_path / "inside.onnx")
    assert load_model(inside).model.graph.node
    outside = _save(nested_if(MAX_SUBGRAPH_DEPTH + 1), tmp_path / "outside.onnx")
    with pytest.raises(ModelInvalidError) as info:
        load_model(outside)
    message = info.value.message
    assert str(outside) in message
    assert (
        f"{MAX_SUBGRAPH_DEPTH + 1} deep" in message and f"at most {MAX_SUBGRAPH_DEPTH}" in message
    )
    assert "(If 'if0' > If 'if1' > If 'if2' > ... > If 'if7' > If 'if8')" in message


def _loop_around(body: onnx.GraphProto, depth: int) -> onnx.GraphProto:
    """``body`` wrapped in ``depth`` Loops, each running the next once."""
    for d in range(depth):
        loop = helper.make_node("Loop", ["", "keep"], [], name=f"loop{d}", body=body)
        body = helper.make_graph(
            [loop],
            f"body{d}",
            [
                helper.make_tensor_value_info("i", TensorProto.INT64, []),
                helper.make_tensor_value_info("keep", TensorProto.BOOL, []),
            ],
            [helper.make_tensor_value_info("keep", TensorProto.BOOL, [])],
        )
    return body


def test_loop_bodies_and_graph_lists_count_as_levels() -> None:
    leaf = helper.make_graph([], "leaf", [], [])
    assert deepest_nesting(_loop_around(leaf, 3))[0] == 3
    listed = helper.make_node("Custom", [], [], name="many", domain="x")
    listed.attribute.append(helper.make_attribute("bodies", [leaf, _loop_around(leaf, 2)]))
    graph = helper.make_graph([listed], "g", [], [])
    depth, path = deepest_nesting(graph)
    assert depth == 3 and path == ("Custom 'many'", "Loop 'loop1'", "Loop 'loop0'")


def test_the_issues_model_is_refused_by_the_cli_and_the_hint_folds_it(tmp_path: Path) -> None:
    """If nested 20 deep: `sharderd plan` exits 2 naming the depth (before any inference), and the
    command of its hint writes a model that plans."""
    model = _save(nested_if(20), tmp_path / "deep.onnx")
    cli = [sys.executable, "-m", "sharderd.cli", "plan", str(model), "--devices", "1"]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr
    assert "nests subgraphs 20 deep" in refused.stderr
    command = refused.stderr.strip().splitlines()[-1].split("`")[1]
    assert command.startswith("python3 -c ")
    subprocess.run(command, shell=True, check=True, timeout=120, cwd=tmp_path)
    folded = tmp_path / "deep.folded.onnx"
    assert deepest_nesting(onnx.load(folded).graph)[0] == 0
    planned = subprocess.run(
        [*cli[:4], str(folded), "--devices", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert planned.returncode == 0, planned.stderr
