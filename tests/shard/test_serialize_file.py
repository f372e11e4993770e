"""serialize_file on a 1 GiB embedding (more than one ipu-mk2): pieces that each fit, the same outputs."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import onnxruntime as ort

from sharderd.config.schema import Config
from sharderd.examples.sparse_external import big_embedding_model
from sharderd.graph.load import load_model
from sharderd.plan.serialize_choice import PIECE_SHARE
from sharderd.shard.serialize_file import serialize_file

IDS = np.array([[0, 1, 131071, 131072, 131073, 262143, 262142, 7]], np.int64)


def _run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"ids": IDS})[0])


def test_big_embedding_is_cut_into_pieces_that_fit_and_compute_the_same(tmp_path: Path) -> None:
    config = Config()
    target = config.target("ipu-mk2")
    model = big_embedding_model(tmp_path / "m.onnx", hit_ids=tuple(int(i) for i in IDS.ravel()))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out, done = serialize_file(model, config.plan, target, tmp_path / "work")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 300 * 1024  # streamed: far below the 1 GiB table
    assert [(d.node, d.kind) for d in done] == [("/embed/Gather", "rows")]
    table = 256 * 1024 * 1024 * 4
    assert done[0].pieces >= table / (target.memory_bytes * PIECE_SHARE)
    loaded = load_model(out)
    sizes = [4 * np.prod(t.dims) for t in loaded.model.graph.initializer]
    assert max(sizes) <= target.memory_bytes * PIECE_SHARE
    expected = _run(model)
    assert np.count_nonzero(expected) > 0
    np.testing.assert_allclose(_run(out), expected, rtol=1e-6, atol=1e-6)


def test_a_model_that_fits_is_not_rewritten(tmp_path: Path) -> None:
    config = Config()
    model = big_embedding_model(tmp_path / "m.onnx", vocab=1024, hidden=64)
    assert serialize_file(model, config.plan, config.target("ipu-mk2"), tmp_path / "w") == (
        model,
        (),
    )
