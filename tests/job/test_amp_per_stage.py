"""AMP per stage through the real CLI on the fake PopRT: a model whose first compile overflows one
stage compiles at the next attempt with a lower ``__available_memory`` on that stage only."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from job.test_prove import CONFIG, report, shard

from sharderd import examples
from sharderd.shard.amp import node_amps


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two MatMuls with 8 MB of weights on small activations, then a Tile to 1024 rows and a
    MatMul whose operands (5 MB) make planner temporaries that only its device cannot hold at
    AMP 0.6: on 2 × the 24-tile target the plan is {a} | {b}, and only device 1 overflows."""
    path = tmp_path_factory.mktemp("amp") / "heavy.onnx"
    onnx.save(examples.tiled_tail(hidden=1024, rows=1024, out=256), path)
    return path


def _stages(model: onnx.ModelProto) -> dict[str, int]:
    return {
        n.name: next(a.i for a in n.attribute if a.name == "__pipeline_stage")
        for n in model.graph.node
    }


def test_only_the_overflowed_stage_gets_a_lower_amp(heavy: Path, tmp_path: Path) -> None:
    config = tmp_path / "sharderd.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    proc, compiles = shard(heavy, config, out, 2)
    assert proc.returncode == 0, proc.stderr
    assert [c["result"] for c in compiles] == ["error", "ok"]
    assert "out of memory on tile" in compiles[0]["error"].lower()
    assert compiles[0]["ipu_bytes"][0] <= 638976 < compiles[0]["ipu_bytes"][1]
    # the session option stays at the default; only the overflowed stage's matmuls carry less
    assert [c["options"]["available_memory_proportion"] for c in compiles] == [0.6, 0.6]
    assert compiles[0]["op_amps"] == [] and compiles[1]["op_amps"] == pytest.approx([0.1])
    written = onnx.load(out / "heavy.sharded.onnx")
    stages = _stages(written)
    assert stages["MatMul_b"] == 1 and stages["MatMul_a1"] == stages["MatMul_a2"] == 0
    assert node_amps(written.graph) == pytest.approx({"MatMul_b": 0.1})
    data = report(out)
    assert [s["available_memory_proportion"] for s in data["plan"]["stages"]] == pytest.approx(
        [0.6, 0.1]
    )
    retry = data["attempts"][data["chosen_attempt"]]
    assert retry["options"]["stage_available_memory_proportion"] == pytest.approx([0.6, 0.1])
    assert retry["options"]["available_memory_proportion"] == 0.6
    assert "stage 0: 0.6, stage 1: 0.1" in (out / "report.md").read_text()
    assert "# stage 1: available_memory_proportion 0.1" in (out / "heavy.sharding.yaml").read_text()


def test_amp_per_stage_off_retries_the_whole_compile(heavy: Path, tmp_path: Path) -> None:
    config = tmp_path / "sharderd.toml"
    config.write_text(CONFIG + "amp_per_stage = false\n")
    out = tmp_path / "out"
    proc, compiles = shard(heavy, config, out, 2)
    assert proc.returncode == 0, proc.stderr
    assert [c["options"]["available_memory_proportion"] for c in compiles] == [0.6, 0.1]
    assert all(c["op_amps"] == [] for c in compiles)
    assert node_amps(onnx.load(out / "heavy.sharded.onnx").graph) == {}
    data = report(out)
    assert [s["available_memory_proportion"] for s in data["plan"]["stages"]] == [0.1, 0.1]
    assert "stage_available_memory_proportion" not in data["attempts"][1]["options"]
