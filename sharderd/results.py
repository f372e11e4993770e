"""What the Python API returns: frozen, typed views of report.json's sections.

``report/`` builds the report dicts (the one place that does); each value here is read from one
of them and keeps it, so ``to_dict()`` gives exactly what ``report.json`` holds and a key ``report/``
adds later reaches ``to_dict()`` at once. A typed field is one line more in the class and in its
``_from`` function. Stdlib only: ``import sharderd`` stays light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Attempt", "Plan", "ShardResult", "Stage", "Verification"]


def _frozen(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: what device ``index`` runs and what it is predicted to cost."""

    index: int
    """Stage number == device (``__pipeline_stage`` == ``__ipu_number``)."""
    nodes: tuple[str, ...] = field(repr=False)
    """Its nodes' names, in the model's order."""
    ops: tuple[str, ...] = field(repr=False)
    """Their op types, one per node."""
    flops: float
    weight_bytes: int
    activation_bytes: int
    """Peak bytes live at once, the tensors received and held for sending included."""
    code_bytes: int
    memory_bytes: int
    """weights + activations + code, as predicted."""
    budget_bytes: int
    """What the planner allowed: capacity / (safety margin × correction)."""
    capacity_bytes: int
    time_s: float
    """Predicted time per batch: compute plus receiving from and sending to its neighbours."""
    _json: str = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The stage's entry in report.json's ``plan.stages`` (without node lists)."""
        data: dict[str, Any] = json.loads(self._json)
        return data


@dataclass(frozen=True, slots=True)
class Plan:
    """A split of the model into ``len(stages)`` pipeline stages, one device each."""

    devices: int
    stages: tuple[Stage, ...]
    bottleneck_s: float
    """The slowest stage's predicted time: the pipeline's predicted period per batch."""
    lower_bound_s: float
    """No split onto these devices can be faster than this (same cost model)."""
    method: str
    """What produced the split (``ideals``, ``contracted``, ``neighbourhood``, ``orders``,
    ``overfull``); docs/planning.md says what each promises."""
    claim: str
    """What is known of this split's optimality, in words."""
    proven_optimal: bool
    """True when no valid split has a smaller predicted bottleneck."""
    digest: str
    """Identifies the split: two plans with the same digest compile identically."""
    _json: str = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """report.json's ``plan`` section, as ``sharderd plan --json`` prints it."""
        data: dict[str, Any] = json.loads(self._json)
        return data


def plan_from_section(
    section: Mapping[str, Any], nodes: Sequence[Sequence[tuple[str, str]]]
) -> Plan:
    """The typed plan of report.json's ``plan`` section; ``nodes[s]``: (name, op type) of stage s."""
    stages = tuple(
        Stage(
            index=st["index"],
            nodes=tuple(name for name, _ in nodes[st["index"]]),
            ops=tuple(op for _, op in nodes[st["index"]]),
            flops=st["flops"],
            weight_bytes=st["weight_bytes"],
            activation_bytes=st["activation_bytes"],
            code_bytes=st["code_bytes"],
            memory_bytes=st["memory_bytes"],
            budget_bytes=st["budget_bytes"],
            capacity_bytes=st["capacity_bytes"],
            time_s=st["time_s"],
            _json=_frozen(st),
        )
        for st in section["stages"]
    )
    return Plan(
        devices=section["devices"],
        stages=stages,
        bottleneck_s=section["bottleneck_s"],
        lower_bound_s=section["lower_bound_s"],
        method=section["method"],
        claim=section["claim"],
        proven_optimal=section["proven_optimal"],
        digest=section["digest"],
        _json=_frozen(section),
    )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One compile (or run) of a plan on the backend, and how it ended."""

    index: int
    label: str
    """Why it ran: ``plan``, ``probe``, ``retry``, ``speculative``, ... (report.json's ``label``)."""
    plan_digest: str
    outcome: str
    """``ok``, ``oom``, ``invalid``, ``timeout``, ``crashed``, ``cancelled``, ..."""
    message: str
    duration_s: float
    predicted_bottleneck_s: float
    throughput_per_s: float | None
    """Measured samples per second, when the backend benchmarked it."""
    _json: str = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        """The attempt's entry in report.json's ``attempts``."""
        data: dict[str, Any] = json.loads(self._json)
        return data


def _attempt(data: Mapping[str, Any]) -> Attempt:
    benchmark = data.get("benchmark")
    return Attempt(
        index=data["index"],
        label=data["label"],
        plan_digest=data["plan_digest"],
        outcome=data["outcome"],
        message=data["message"],
        duration_s=data["duration_s"],
        predicted_bottleneck_s=data["predicted_bottleneck_s"],
        throughput_per_s=None if not benchmark else benchmark["throughput_per_s"],
        _json=_frozen(data),
    )


@dataclass(frozen=True, slots=True)
class Verification:
    """The sharded model's outputs compared with the input model's, on the same inputs."""

    passed: bool
    failed_outputs: tuple[str, ...]
    """Names of the outputs outside the tolerances (empty when ``passed``)."""
    max_abs_error: float
    """The largest absolute difference over every output."""
    _json: str = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """report.json's ``verification`` block (tolerances and each output's check)."""
        data: dict[str, Any] = json.loads(self._json)
        return data


def _verification(data: Mapping[str, Any]) -> Verification:
    outputs = data.get("outputs", {}).values()
    return Verification(
        passed=bool(data["passed"]),
        failed_outputs=tuple(o["name"] for o in outputs if not o["passed"]),
        max_abs_error=max((float(o["max_abs"]) for o in outputs), default=0.0),
        _json=_frozen(data),
    )


@dataclass(frozen=True, slots=True)
class ShardResult:
    """A finished ``shard``: the files written, the plan they carry, and how it was proven."""

    status: str
    """What happened to the plan: ``compiled`` (PopRT compiled it), ``verified`` (onnxruntime ran
    its stages and checked their outputs against the model; nothing was compiled) or
    ``not_compiled`` (backend ``none``: planned and written, proven by nothing)."""
    backend: str
    """The backend that proved it (``auto`` resolved), or ``none``."""
    out: Path
    model: Path
    """The annotated model (``<stem>.sharded.onnx``)."""
    sharding_config: Path
    """PopRT's manual-sharding YAML (``<stem>.sharding.yaml``)."""
    external_data: tuple[Path, ...]
    compiled: Path | None
    """The backend's artifact (PopEF, or onnxruntime's per-stage models), when it wrote one."""
    report: Path
    """report.json; report.md and report.html are beside it."""
    plan: Plan
    attempts: tuple[Attempt, ...]
    chosen_attempt: int | None
    """Index into ``attempts`` of the attempt whose plan was written (None with backend none)."""
    verification: Verification | None
    """None when the backend does not compare outputs (poprt, none)."""
    _json: str = field(repr=False)

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file and folder written under ``out``."""
        written = (self.model, self.sharding_config, *self.external_data)
        reports = tuple(
            self.report.with_name(n) for n in ("report.json", "report.md", "report.html")
        )
        return written + reports + ((self.compiled,) if self.compiled else ())

    def to_dict(self) -> dict[str, Any]:
        """report.json, whole."""
        data: dict[str, Any] = json.loads(self._json)
        return data


def shard_result(
    report: Mapping[str, Any], out: Path, nodes: Sequence[Sequence[tuple[str, str]]]
) -> ShardResult:
    """The typed result of a finished job's report.json; ``nodes`` as for ``plan_from_section``."""
    outputs = report["outputs"]
    verification = report.get("verification")
    compiled = outputs.get("compiled")
    return ShardResult(
        status=report["status"],
        backend=report["backend"],
        out=out,
        model=out / outputs["model"],
        sharding_config=out / outputs["sharding_config"],
        external_data=tuple(out / p for p in outputs["external_data"]),
        compiled=None if compiled is None else out / compiled,
        report=out / outputs["report_json"],
        plan=plan_from_section(report["plan"], nodes),
        attempts=tuple(_attempt(a) for a in report["attempts"]),
        chosen_attempt=report.get("chosen_attempt"),
        verification=None if verification is None else _verification(verification),
        _json=_frozen(report),
    )
