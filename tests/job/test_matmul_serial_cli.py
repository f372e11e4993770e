"""PopART's matmul serialization through the real CLI on the fake PopRT: a MatMul whose
temporaries overflow a device alone at the lowest AMP is not "does not fit" until it overflowed
serialized too; when serialized it fits, the job compiles with the node serialized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from job.test_prove import CONFIG, report, shard

from sharderd.examples.builder import Graph, float_info, graph_model
from sharderd.shard.matmul_serial import node_serialization

TILE_BYTES = 638976


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x[320, 256] → MatMul_a (256×1280) → Relu_a → MatMul_big (1280×1024, 5 MiB) → y.

    MatMul_big needs over half of a 24-tile device alone by the model, so it is the probe; on
    the fake, alone at AMP 0.1, its planner temporaries put its worst tile ~3% over, and in 16
    pieces ~4% under; on 2 devices the plan {MatMul_a, Relu_a} | {MatMul_big} fits with it
    serialized at the default AMP."""
    g = Graph(name_nodes=True)
    x = g.op("MatMul", "MatMul_a", "x", g.weight("wa", np.full((256, 1280), 0.01, np.float32)))
    x = g.op("Relu", "Relu_a", x)
    wb = g.weight("wb", np.full((1280, 1024), 0.01, np.float32))
    g.op("MatMul", "MatMul_big", x, wb, out="y")
    graph = g.to_graph("wide", [float_info("x", [320, 256])], [float_info("y", [320, 1024])])
    path = tmp_path_factory.mktemp("serial") / "wide.onnx"
    onnx.save(graph_model(graph, "a small MatMul, then a wide one"), path)
    return path


def test_a_matmul_too_big_alone_compiles_serialized(wide: Path, tmp_path: Path) -> None:
    config = tmp_path / "sharderd.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    proc, compiles = shard(wide, config, out, 2)
    assert proc.returncode == 0, proc.stderr
    probes = [c for c in compiles if c["options"]["num_ipus"] == 1]
    assert [(c["result"], c["serialized_matmuls"]) for c in probes] == [
        ("error", {}),
        ("ok", {"MatMul_big": 16}),
    ]
    assert all(c["options"]["available_memory_proportion"] == 0.1 for c in probes)
    assert probes[0]["ipu_bytes"][0] > TILE_BYTES >= probes[1]["ipu_bytes"][0]
    assert compiles[-1]["result"] == "ok" and compiles[-1]["serialized_matmuls"] == {
        "MatMul_big": 16
    }
    written = onnx.load(out / "wide.sharded.onnx")
    assert node_serialization(written.graph) == {"MatMul_big": 16}
    data = report(out)
    pieces = [{"node": "MatMul_big", "mode": "output_channels", "factor": 16}]
    assert data["plan"]["matmul_serialization"] == pieces
    chosen = data["attempts"][data["chosen_attempt"]]
    assert chosen["options"]["matmul_serialization"] == pieces
    assert "matmul_serialization" not in data["attempts"][0]["options"]
    assert "`MatMul_big` output_channels ×16" in (out / "report.md").read_text()


def test_a_matmul_too_big_alone_even_serialized_is_proven(wide: Path, tmp_path: Path) -> None:
    """Weights ×1.2 put MatMul_big over a device alone in 16 pieces too: exit 3, grounds
    ``probe``, after the plan, the probe and the serialized probe (the plan may be cancelled)."""
    config = tmp_path / "sharderd.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    proc, compiles = shard(wide, config, out, 2, truth={"weight_factor": 1.2})
    assert proc.returncode == 3, proc.stderr
    probes = [c for c in compiles if c["options"]["num_ipus"] == 1]
    assert [c["serialized_matmuls"] for c in probes] == [{}, {"MatMul_big": 16}]
    assert all(c["result"] == "error" for c in probes) and len(compiles) <= 3
    assert "'MatMul_big' compiled alone on one device" in proc.stderr
    assert "even with its matmul serialized ×16" in proc.stderr
    assert report(out)["verdict"] == {"proven": True, "grounds": "probe"}


def test_a_serialized_probe_whose_compiled_model_lost_the_attributes_is_no_proof(
    wide: Path, tmp_path: Path
) -> None:
    """The same overflow, but PopRT's conversion rewrites MatMul_big as a Gemm, so the MatMul
    attributes sharderd puts back by name never reach the compiler: the serialized probe compiled
    the node whole, and its overflow proves nothing about 16 pieces. Not exit 3: exit 5, saying
    why."""
    config = tmp_path / "sharderd.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    gemm = {"FAKE_POPRT_CONVERT_OPS": '{"MatMul_big": "Gemm"}'}
    proc, compiles = shard(wide, config, out, 2, truth={"weight_factor": 1.2}, env_extra=gemm)
    assert proc.returncode == 5, proc.stderr
    probes = [c for c in compiles if c["options"]["num_ipus"] == 1]
    assert [c["serialized_matmuls"] for c in probes] == [{}, {}]
    assert all(c["result"] == "error" for c in probes)
    assert "without __serialize_matmul_* on 'MatMul_big' ×16" in proc.stderr
    data = report(out)
    assert data["verdict"] == {"proven": False, "grounds": None}
    serialized = next(a for a in data["attempts"] if "serialized" in a["label"])
    assert serialized["details"]["matmul_serialization"] == {}
