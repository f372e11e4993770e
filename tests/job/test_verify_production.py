"""Verification through the production path: ``shard_job`` with the onnxruntime backend, the
attempt in its real worker process, and a fault injected where annotating/writing happens.

The reference is the user's input file, so a stage or annotation corrupted on the way out fails
the check (with the stripped annotated output as reference, both sides would carry the fault).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import onnx
import pytest
from onnx import numpy_helper

from sharderd.backends.pool import AttemptPool
from sharderd.config import Config, search_options
from sharderd.errors import VerificationError
from sharderd.job import session as session_module
from sharderd.job.run import JobFailed, JobSpec, shard_job


def _run(model: Path, tmp_path: Path) -> Any:
    spec = JobSpec(
        model=model,
        out_dir=tmp_path / "out",
        stem=model.stem,
        devices=3,
        config=Config(),
        search=search_options(Config(), backend="onnxruntime", max_attempts=1),
        target="cpu",
    )

    async def main() -> Any:
        return await shard_job(
            spec, pool=AttemptPool(1), workdir=tmp_path / "work", emit=lambda *_: None
        )

    return anyio.run(main)


def _tamper(monkeypatch: pytest.MonkeyPatch, change: Callable[[onnx.ModelProto], None]) -> None:
    real = session_module.PlanService.plan

    def plan(self: Any, request: Any) -> Any:
        result = real(self, request)
        if result.files is not None:
            path = str(result.files.model)
            proto = onnx.load(path)
            change(proto)
            onnx.save(proto, path)
        return result

    monkeypatch.setattr(session_module.PlanService, "plan", plan)


def test_a_clean_job_verifies(model_path: Callable[..., Path], tmp_path: Path) -> None:
    result = _run(model_path("shared_weights"), tmp_path)
    assert result.report["verification"]["passed"]


def test_a_tampered_stage_fails_verification(
    model_path: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def change(proto: onnx.ModelProto) -> None:
        weight = next(t for t in proto.graph.initializer if t.name == "layer5.bias")
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 0.01, weight.name))

    _tamper(monkeypatch, change)
    with pytest.raises(JobFailed) as failed:
        _run(model_path("shared_weights"), tmp_path)
    assert isinstance(failed.value.error, VerificationError)
    assert "differs from the unsharded model" in failed.value.message


def test_a_tampered_annotation_fails_verification(
    model_path: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def change(proto: onnx.ModelProto) -> None:
        next(n for n in proto.graph.node if n.name == "/prod/Mul").op_type = "Add"

    _tamper(monkeypatch, change)
    with pytest.raises(JobFailed) as failed:
        _run(model_path("multi_io"), tmp_path)
    assert isinstance(failed.value.error, VerificationError)
    assert "'out_prod'" in failed.value.message
