"""serialize_for_devices: a wide head whose own time holds every split up is cut into column pieces
when re-planning shows a lower bottleneck, and left whole when it does not or cannot be cut."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from sharderd import examples
from sharderd.config.schema import Config
from sharderd.engine import analyze_file
from sharderd.plan.bounds import node_work
from sharderd.plan.ordered_costs import calibrated_compute_s
from sharderd.plan.serialize_choice import BOTTLENECK_GAIN
from sharderd.shard.serialize_bottleneck import serialize_for_devices
from sharderd.target import Target

X = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)


def _run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": X})[0])


def _head_holds_the_bound_up(path: Path, target: Target, devices: int) -> bool:
    analysis = analyze_file(path, Config().plan)
    work = node_work(analysis, target, calibrated_compute_s(analysis, target, None))
    head = analysis.flow.node_names.index("MatMul_head")
    return bool(work.node_s[head] > work.total_s / devices)


def test_a_head_that_holds_the_bottleneck_up_is_cut_and_computes_the_same(tmp_path: Path) -> None:
    config = Config()
    model = examples.save(examples.wide_head(), tmp_path / "m.onnx")
    done = serialize_for_devices(model, config.plan, config.target("cpu"), 4, tmp_path / "w")
    [record] = done.records
    assert (record.node, record.kind, record.reason) == ("MatMul_head", "columns", "bottleneck")
    assert record.pieces >= 2 and record.bottleneck_s is not None
    before, after = record.bottleneck_s
    assert after < before * (1 - BOTTLENECK_GAIN)
    assert done.path != model and done.analysis is not None
    assert done.analysis.loaded.path == done.path
    assert set(record.piece_nodes) <= set(done.analysis.flow.node_names)
    np.testing.assert_allclose(_run(done.path), _run(model), rtol=1e-5, atol=1e-5)


def test_a_cut_is_not_kept_when_the_copies_eat_the_gain(tmp_path: Path) -> None:
    config = Config()
    # a device whose links are slow next to its compute: the pieces' outputs cost more to gather
    # at the Concat than splitting the head saves
    slow_links = replace(config.target("cpu"), name="slow-links", link_bytes_per_s=1e8)
    model = examples.save(examples.wide_head(), tmp_path / "m.onnx")
    assert _head_holds_the_bound_up(model, slow_links, 4)  # so the rewrite was tried
    done = serialize_for_devices(model, config.plan, slow_links, 4, tmp_path / "w")
    assert (done.path, done.records) == (model, ())
    assert not list((tmp_path / "w").glob("*bottleneck*"))  # the tried copy is removed


def test_a_head_that_cannot_be_cut_or_does_not_hold_the_bound_up_stays(tmp_path: Path) -> None:
    config = Config()
    proto = examples.wide_head()
    head = next(t for t in proto.graph.initializer if t.name == "head")
    proto.graph.initializer.remove(head)  # the head's weight becomes an input: not a constant
    proto.graph.input.append(onnx.helper.make_tensor_value_info("head", head.data_type, head.dims))
    fed = examples.save(proto, tmp_path / "fed.onnx")
    cpu = config.target("cpu")
    assert _head_holds_the_bound_up(fed, cpu, 4)
    assert serialize_for_devices(fed, config.plan, cpu, 4, tmp_path / "w1").records == ()
    # on one device nothing holds a split up: the head is the model's own time
    whole = examples.save(examples.wide_head(), tmp_path / "m.onnx")
    assert serialize_for_devices(whole, config.plan, cpu, 1, tmp_path / "w2").records == ()
