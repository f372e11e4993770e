"""``sharderd plan`` with serialization plans a temporary serialized copy; its report still names the
user's file (path, name, sha256), as ``sharderd shard``'s does."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sharderd.cli import main as cli_main
from sharderd.examples.sparse_external import big_embedding_model


def test_plan_report_names_the_users_file_not_the_serialized_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = big_embedding_model(tmp_path / "big.onnx", hit_ids=(0, 262143))
    argv = ["plan", str(model), "--devices", "4", "--target", "ipu-mk2", "--json"]
    assert cli_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    [serialized] = report["serialized"]
    assert serialized["node"] == "/embed/Gather"
    assert report["model"]["path"] == str(model)
    assert report["model"]["name"] == "big.onnx"
    assert report["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
