"""Per-op AMP on the fake PopRT: ``__available_memory`` caps that op's temporaries as the session
option does for all, and the poprt backend keeps it through PopRT's conversion."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.backends import poprt as backend
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.shard.amp import AMP_ATTR, node_amps, set_stage_amps, stage_amps_of

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_poprt"
PIPELINED = {
    "num_ipus": 2,
    "virtual_graph_mode": "manual",
    "enable_pipelining": True,
    "batches_per_step": 2,
}


@pytest.fixture
def poprt(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for var in ("FAKE_POPRT_TRUTH", "FAKE_POPRT_MODE", "FAKE_POPRT_LOG", "POPLAR_ENGINE_OPTIONS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(FAKE))
    import poprt as fake

    yield fake
    for name in [n for n in sys.modules if n == "poprt" or n.startswith("poprt.")]:
        del sys.modules[name]


def two_stages(width: int = 1024) -> onnx.ModelProto:
    """x → MatMul_0 → Relu_0 (stage 0) → MatMul_1 → Relu_1 (stage 1)."""
    nodes, inits, prev = [], [], "x"
    for k in range(2):
        inits.append(numpy_helper.from_array(np.ones((width, width), np.float32), f"w{k}"))
        for node in (
            helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"MatMul_{k}"),
            helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"Relu_{k}"),
        ):
            node.attribute.extend(
                [
                    helper.make_attribute("__ipu_number", k),
                    helper.make_attribute("__pipeline_stage", k),
                ]
            )
            nodes.append(node)
        prev = f"r{k}"
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ipu_bytes(poprt: ModuleType, model: onnx.ModelProto, amp: float = 0.6) -> list[int]:
    options = poprt.compiler.CompilerOptions.from_dict(
        {**PIPELINED, "available_memory_proportion": amp}
    )
    return poprt.compiler.Compiler.compile(model, None, options).popef["ipu_bytes"]


@pytest.mark.parametrize("truth", ["{}", '{"op_tiles": 0.05}', '{"noise": 0.1}'])
def test_a_stage_s_own_amp_changes_that_ipu_only_as_the_session_option_would(
    poprt: ModuleType, monkeypatch: pytest.MonkeyPatch, truth: str
) -> None:
    monkeypatch.setenv("FAKE_POPRT_TRUTH", truth)
    default = ipu_bytes(poprt, two_stages())
    everywhere_low = ipu_bytes(poprt, two_stages(), amp=0.1)
    model = two_stages()
    set_stage_amps(model, (None, 0.1))
    mixed = ipu_bytes(poprt, model)
    assert mixed[0] == default[0]
    assert mixed[1] == everywhere_low[1]
    assert everywhere_low[1] != default[1]
    raised = two_stages()
    set_stage_amps(raised, (1.0, None))  # the attribute overrides the session option upwards too
    assert ipu_bytes(poprt, raised, amp=0.1)[0] == ipu_bytes(poprt, two_stages(), amp=1.0)[0]


def test_an_amp_attribute_out_of_range_is_refused(poprt: ModuleType) -> None:
    model = two_stages()
    set_stage_amps(model, (None, 1.5))
    with pytest.raises(RuntimeError, match=r"must be in \(0,1\]"):
        ipu_bytes(poprt, model)


def test_an_int_or_non_matmul_attribute_is_not_read_as_an_amp(poprt: ModuleType) -> None:
    default = ipu_bytes(poprt, two_stages())
    model = two_stages()
    model.graph.node[2].attribute.append(helper.make_attribute(AMP_ATTR, 1))  # INT, not FLOAT
    model.graph.node[3].attribute.append(helper.make_attribute(AMP_ATTR, 0.1))  # on a Relu
    assert ipu_bytes(poprt, model) == default


def compile_two_stages(
    model: onnx.ModelProto, tmp_path: Path
) -> tuple[AttemptRequest, AttemptOutcome]:
    """Save ``model`` and run the poprt attempt on it (two devices of the fake), as a job would."""
    path = tmp_path / "two.onnx"
    onnx.save(model, path)
    request = AttemptRequest(
        backend="poprt",
        model=str(path),
        artifact=str(tmp_path / "two.popef"),
        num_devices=2,
        tiles_per_device=1472,
        options={"ipu_version": "ipu2", "batches_per_step": 2},
    )
    return request, backend.run_attempt(request)


def test_the_backend_keeps_the_stage_amp_through_conversion(
    poprt: ModuleType, tmp_path: Path
) -> None:
    """The converter drops ``__`` attributes; the backend puts ``__available_memory`` back by
    name, the compile sees it (stage 1's bytes as at 0.1) and the message says so."""
    model = two_stages()
    set_stage_amps(model, (None, 0.1))
    request, outcome = compile_two_stages(model, tmp_path)
    assert outcome.outcome == "ok", outcome.message
    assert "__available_memory on the conv/matmul nodes of stage 1: 0.1" in outcome.message
    converted = onnx.load(f"{request.artifact}.converted.onnx")
    assert node_amps(converted.graph) == pytest.approx({"MatMul_1": 0.1})
    assert stage_amps_of(converted.graph) == pytest.approx({1: 0.1})
