"""job/codec.py: every SharderdError subtype crosses the planning worker's pipe as itself."""

from __future__ import annotations

import importlib
import json
import pkgutil
from typing import Any

import pytest

import sharderd
from sharderd.config.load import LocatedError
from sharderd.errors import (
    DimsUnresolvedError,
    PlanInfeasibleError,
    PlanningLimitError,
    SharderdError,
)
from sharderd.job.codec import (
    ModelSummary,
    decode_error,
    decode_summary,
    encode_error,
    encode_summary,
)
from sharderd.job.run import JobFailed


def _all_subclasses() -> list[type[SharderdError]]:
    for module in pkgutil.walk_packages(sharderd.__path__, "sharderd."):
        if ".examples" not in module.name and "__main__" not in module.name:
            importlib.import_module(module.name)
    found: list[type[SharderdError]] = [SharderdError]
    for cls in found:
        found.extend(c for c in cls.__subclasses__() if c not in found)
    return found


def _instance(cls: type[SharderdError]) -> SharderdError:
    special: dict[type, Any] = {
        PlanInfeasibleError: lambda: PlanInfeasibleError(
            "weights", grounds="weights_total", min_devices=7, short_bytes=12
        ),
        DimsUnresolvedError: lambda: DimsUnresolvedError("dims", dims=(("x", 0, "batch"),)),
        LocatedError: lambda: LocatedError("bad key", path=("plan", "dims"), hint="fix it"),
        JobFailed: lambda: JobFailed(PlanInfeasibleError("w", grounds="probe"), {"status": "x"}),
        PlanningLimitError: lambda: PlanningLimitError(
            "over", hint="raise it", limit="time", key="planning_timeout", allowed=10.0, used=10.5
        ),
    }
    if cls in special:
        return special[cls]()
    try:
        return cls("something went wrong", hint="do this")
    except TypeError:  # a constructor of its own (FieldError: key, message)
        return cls("key", "is out of range")  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", _all_subclasses(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_error_type_survives_the_round_trip(cls: type[SharderdError]) -> None:
    error = _instance(cls)
    error.extra = 3  # type: ignore[attr-defined]  # a field set after construction travels too
    back = decode_error(json.loads(json.dumps(encode_error(error))))
    assert type(back) is cls
    assert str(back) == str(error)
    assert (back.exit_code, back.reason) == (error.exit_code, error.reason)
    assert back.to_dict() == error.to_dict()
    assert back.extra == 3  # type: ignore[attr-defined]


def test_a_payload_naming_no_sharderd_error_is_a_plain_one() -> None:
    for name in ("builtins:ValueError", "os:system", "sharderd.errors:fmt", ""):
        back = decode_error({"class": name, "fields": {"message": "m", "hint": None}})
        assert type(back) is SharderdError and back.message == "m"


def test_a_model_summary_comes_back_as_the_same_frozen_value() -> None:
    """Through JSON, shapes come back as tuples of ints and warnings as a tuple: equal values."""
    summary = ModelSummary(
        {"name": "m.onnx", "nodes": 3, "opsets": {"ai.onnx": 17}},
        ("batch dim fixed to 1",),
        "fp16",
        {"input_ids": (1, 128), "mask": (1, 1, 128)},
        0.25,
    )
    back = decode_summary(json.loads(json.dumps(encode_summary(summary))))
    assert back == summary
    assert isinstance(back.input_shapes["mask"], tuple)


def test_a_summary_with_rewrites_and_their_trial_comes_back_the_same() -> None:
    from sharderd.plan.serialize_choice import BottleneckTrial
    from sharderd.shard.serialize import Serialized

    record = Serialized("head", "MatMul", "columns", 2, ("head/piece0/MatMul", "head/piece1/MatMul"),
                        "bottleneck", (2e-3, 1e-3))  # fmt: skip
    for trial in (
        BottleneckTrial((("head", "MatMul", 2),), 2e-3, 9e-4, True, 1e-3, True),
        BottleneckTrial((("head", "MatMul", 3),), 2e-3, 1.9e-3, False, None, False),
    ):
        summary = ModelSummary({"name": "m.onnx"}, (), "fp32", {"x": (1, 2)}, 0.5, (record,), trial)
        back = decode_summary(json.loads(json.dumps(encode_summary(summary))))
        assert back == summary
