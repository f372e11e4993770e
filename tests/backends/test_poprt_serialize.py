"""PopART's matmul serialization on the fake PopRT: a serialized MatMul's temporaries shrink (the
fake's own model), and the poprt backend keeps the attributes through PopRT's conversion."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import onnx
import pytest
from backends.test_poprt_amp import compile_two_stages, ipu_bytes, poprt, two_stages
from onnx import helper

from sharderd.shard.matmul_serial import MODE_ATTR, node_serialization, set_serialization

__all__ = ["poprt"]  # the fixture, used by name


@pytest.mark.parametrize("truth", ["{}", '{"op_tiles": 0.05}'])
def test_a_serialized_matmul_needs_less_on_its_ipu_only(
    poprt: ModuleType, monkeypatch: pytest.MonkeyPatch, truth: str
) -> None:
    monkeypatch.setenv("FAKE_POPRT_TRUTH", truth)
    default = ipu_bytes(poprt, two_stages())
    model = two_stages()
    assert set_serialization(model, {"MatMul_1": 8}) == 1
    serial = ipu_bytes(poprt, model)
    assert serial[0] == default[0] and serial[1] < default[1]
    more = two_stages()
    set_serialization(more, {"MatMul_1": 16})
    assert ipu_bytes(poprt, more)[1] < serial[1]  # more pieces, less at a time
    off = two_stages()
    set_serialization(off, {"MatMul_1": 8})
    for a in off.graph.node[2].attribute:
        if a.name == MODE_ATTR:
            a.s = b"none"
    assert ipu_bytes(poprt, off) == default


def test_an_unknown_serialization_mode_is_refused(poprt: ModuleType) -> None:
    model = two_stages()
    model.graph.node[2].attribute.append(helper.make_attribute(MODE_ATTR, "diagonal"))
    with pytest.raises(RuntimeError, match="matmul serialization"):
        ipu_bytes(poprt, model)


def test_the_backend_keeps_the_serialization_through_conversion(
    poprt: ModuleType, tmp_path: Path
) -> None:
    """The converter drops ``__`` attributes; the backend puts the two back by name, the compile
    sees them (stage 1's bytes as serialized) and the message says so."""
    model = two_stages()
    set_serialization(model, {"MatMul_1": 8})
    expected = ipu_bytes(poprt, model)
    request, outcome = compile_two_stages(model, tmp_path)
    assert outcome.outcome == "ok", outcome.message
    assert "matmul serialization: MatMul_1 ×8" in outcome.message
    converted = onnx.load(f"{request.artifact}.converted.onnx")
    assert node_serialization(converted.graph) == {"MatMul_1": 8}
    assert json.loads(Path(request.artifact).read_text())["ipu_bytes"] == expected
