"""What crosses the planning worker's pipe, as frozen values: the plans (``Planned``: the ``Plan``
with its stage contents and the files written; ``Probed``), the corrections, and the errors.

Only the worker (``job/planworker.py``) and its client (``job/session.py``) use this. An error
travels as its class (module and name, under ``sharderd``) and its instance fields, so every
``SharderdError`` subtype comes back as itself, with its exit code, reason and numbers, whatever
its constructor takes. Tuples come back as tuples (JSON has lists only; no error field is a list).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sharderd.errors import SharderdError
from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import StageView
from sharderd.plan.types import BottleneckHolder, CutTensor, Plan, StageCost

if TYPE_CHECKING:  # the engine (onnx) loads only where a plan is written or read back
    from sharderd.engine import ShardFiles
    from sharderd.plan.serialize_choice import BottleneckTrial
    from sharderd.shard.serialize import Serialized

__all__ = [
    "ModelSummary",
    "Planned",
    "Probed",
    "decode_content",
    "decode_error",
    "decode_planned",
    "decode_probed",
    "decode_summary",
    "encode_error",
    "encode_planned",
    "encode_probed",
    "encode_summary",
]


@dataclass(frozen=True, slots=True)
class Planned:
    """A plan the service made, and the files it wrote for it (None: not written)."""

    plan: Plan
    files: ShardFiles | None = None


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """The analysed model as a job needs it: the report's model facts (built by
    ``report.build.model_facts``), the analysis warnings, and what the compiles are fed."""

    facts: Mapping[str, Any]
    warnings: tuple[str, ...]
    precision: str
    input_shapes: Mapping[str, tuple[int, ...]]
    analyze_s: float
    """Seconds to load and analyse the model."""
    serialized: tuple[Serialized, ...] = ()
    """The nodes rewritten into pieces before analysis (``shard.serialize_bottleneck``)."""
    trial: BottleneckTrial | None = None
    """The rewrite for the bottleneck that was priced, kept or not."""


def encode_summary(summary: ModelSummary) -> dict[str, Any]:
    return asdict(summary)


def _serialized(data: Mapping[str, Any]) -> Serialized:
    from sharderd.shard.serialize import Serialized

    before_after = data.get("bottleneck_s")
    return Serialized(
        **{
            **data,
            "piece_nodes": tuple(data["piece_nodes"]),
            "bottleneck_s": None if before_after is None else tuple(before_after),
        }
    )


def decode_summary(data: Mapping[str, Any]) -> ModelSummary:
    shapes = {str(k): tuple(int(d) for d in v) for k, v in dict(data["input_shapes"]).items()}
    warnings = tuple(str(w) for w in data["warnings"])
    serialized = tuple(_serialized(r) for r in data.get("serialized", ()))
    trial = data.get("trial")
    return ModelSummary(
        dict(data["facts"]),
        warnings,
        str(data["precision"]),
        shapes,
        float(data["analyze_s"]),
        serialized,
        None if trial is None else _trial(trial),
    )


def _trial(data: Mapping[str, Any]) -> BottleneckTrial:
    from sharderd.plan.serialize_choice import BottleneckTrial

    pieces = tuple((str(n), str(op), int(k)) for n, op, k in data["pieces"])
    after = data["after_s"]
    return BottleneckTrial(
        pieces,
        float(data["before_s"]),
        float(data["floor_s"]),
        bool(data["planned"]),
        None if after is None else float(after),
        bool(data["kept"]),
    )


@dataclass(frozen=True, slots=True)
class Probed:
    """The node to compile alone (``plan.probe``), as the search reads it, and its written model."""

    name: str
    need: float
    """Its predicted share of a device alone."""
    view: StageView
    model: Path
    serial_factor: int = 0
    """The factor PopART could serialize it with, if it ran out of memory alone
    (``plan.probe.serial_factor``; 0: none)."""


def encode_planned(planned: Planned) -> dict[str, Any]:
    plan = {f.name: getattr(planned.plan, f.name) for f in fields(Plan)}
    plan.update(
        order=planned.plan.order.tolist(),
        assignment=planned.plan.assignment.tolist(),
        stages=[asdict(s) for s in planned.plan.stages],
        cut_tensors=[asdict(c) for c in planned.plan.cut_tensors],
        orders_tried=dict(planned.plan.orders_tried),
        timings_s=dict(planned.plan.timings_s),
        held_by=None if planned.plan.held_by is None else asdict(planned.plan.held_by),
    )
    files = planned.files
    written = None
    if files is not None:
        written = {
            "model": str(files.model),
            "sharding_yaml": str(files.sharding_yaml),
            "external": [str(p) for p in files.external],
            "routed": [asdict(r) for r in files.routed],
        }
    return {"plan": plan, "files": written}


def decode_planned(data: Mapping[str, Any]) -> Planned:
    p = dict(data["plan"])
    plan = Plan(
        **{
            **p,
            "order": np.asarray(p["order"], dtype=np.int64),
            "assignment": np.asarray(p["assignment"], dtype=np.int64),
            "bounds": tuple(p["bounds"]),
            "stages": tuple(StageCost(**s) for s in p["stages"]),
            "cut_tensors": tuple(CutTensor(**c) for c in p["cut_tensors"]),
            "memory_scale": tuple(p["memory_scale"]),
            "held_by": None
            if p.get("held_by") is None
            else BottleneckHolder(**{**p["held_by"], "tensors": tuple(p["held_by"]["tensors"])}),
        }
    )
    f = data.get("files")
    files = None
    if f is not None:
        from sharderd.engine import ShardFiles
        from sharderd.shard.annotate import RoutedInput

        routed = tuple(RoutedInput(**{**r, "stages": tuple(r["stages"])}) for r in f["routed"])
        external = tuple(Path(x) for x in f["external"])
        files = ShardFiles(Path(f["model"]), Path(f["sharding_yaml"]), external, routed)
    return Planned(plan, files)


def encode_probed(probed: Probed | None) -> dict[str, Any] | None:
    if probed is None:
        return None
    return {**asdict(probed), "model": str(probed.model)}


def decode_probed(data: Mapping[str, Any] | None) -> Probed | None:
    if data is None:
        return None
    v = dict(data["view"])
    view = StageView(**{**v, "runs": tuple((int(a), int(b)) for a, b in v["runs"])})
    factor = int(data.get("serial_factor", 0))
    return Probed(str(data["name"]), float(data["need"]), view, Path(data["model"]), factor)


_NESTED = "__sharderd_error__"


def encode_error(error: SharderdError) -> dict[str, Any]:
    """The error's class and fields as JSON-ready values."""
    cls = type(error)
    fields = {k: _encode(v) for k, v in vars(error).items()}
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}


def decode_error(data: Mapping[str, Any]) -> SharderdError:
    """The error ``encode_error`` wrote, of the same class; a plain ``SharderdError`` when the
    payload names no sharderd error class (a worker of another version)."""
    fields = {k: _decode(v) for k, v in dict(data.get("fields") or {}).items()}
    message = str(fields.get("message", "planning failed"))
    cls = _error_class(str(data.get("class", "")))
    if cls is None:
        return SharderdError(message, hint=fields.get("hint"))
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    vars(error).update(fields)
    return error


def _error_class(name: str) -> type[SharderdError] | None:
    module, _, qualname = name.partition(":")
    if not module.startswith("sharderd.") or not qualname or "." in qualname:
        return None
    try:
        found = getattr(importlib.import_module(module), qualname, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, SharderdError) else None


def _encode(value: Any) -> Any:
    if isinstance(value, SharderdError):
        return {_NESTED: encode_error(value)}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, Mapping):
        if set(value) == {_NESTED}:
            return decode_error(value[_NESTED])
        return {k: _decode(v) for k, v in value.items()}
    return value


def decode_content(data: Mapping[str, Any] | None) -> ContentCorrection | None:
    """A ``ContentCorrection`` sent as ``dataclasses.asdict`` JSON (a plan request's)."""
    if data is None:
        return None

    def runs(key: str) -> tuple[tuple[tuple[tuple[int, int], ...], float], ...]:
        return tuple(
            (tuple((int(a), int(b)) for a, b in r), float(f)) for r, f in data.get(key, ())
        )

    return ContentCorrection(
        float(data["base"]),
        runs("patches"),
        runs("measured"),
        runs("fixed"),
        bool(data.get("fixed_on_heaviest", False)),
    )
