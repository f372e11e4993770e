"""The Python API: ``sharderd.plan``, ``sharderd.shard`` and their helpers (docs/python.md).

Each function is the work of a command: ``plan`` runs what ``sharderd plan`` runs, ``shard`` what
``sharderd shard`` runs (``job.run.run_local``, the same call), with arguments in place of flags.
The heavy modules (onnx, numpy, the engine) load on the first call, not on ``import sharderd``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from sharderd.config import Config, amend_plan, search_options
from sharderd.config import load_config as _load_config
from sharderd.errors import ConfigError
from sharderd.results import Plan, ShardResult, plan_from_section, shard_result
from sharderd.target import BUILTIN_TARGETS, Target

if TYPE_CHECKING:
    import onnx

__all__ = ["load_config", "plan", "shard", "shard_async", "targets"]

Model: TypeAlias = "str | os.PathLike[str] | onnx.ModelProto"
"""A path to an ``.onnx`` file (external data beside it), or a model in memory."""
Backend: TypeAlias = Literal["auto", "poprt", "onnxruntime", "none"]
Precision: TypeAlias = Literal["model", "fp32", "fp16"]
OnEvent: TypeAlias = Callable[[str, Mapping[str, Any]], None]
"""Called with each progress event (``plan.started``, ``attempt.finished``, ...) and its fields."""
_IN_MEMORY_STEM = "model"


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load and validate a ``sharderd.toml``.

    Raises:
        ConfigError: unreadable file, unknown key or bad value (the message names key and line).
    """
    return _load_config(Path(path))


def targets(config: Config | None = None) -> Mapping[str, Target]:
    """Every target a plan can name: the built-ins and the config's ``[targets.<name>]``."""
    custom = {} if config is None else dict(config.custom_targets)
    return MappingProxyType({**BUILTIN_TARGETS, **custom})


def plan(
    model: Model,
    *,
    devices: int,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    serialize: bool = True,
    config: Config | str | os.PathLike[str] | None = None,
) -> Plan:
    """Split ``model`` into ``devices`` pipeline stages; compile nothing, write nothing.

    ``target`` is a name (``targets()``) or a ``Target``; ``None`` takes the config's ``[target]``
    (``ipu-mk2`` by default). ``input_shapes``, ``dims``, ``batch_size`` and ``precision`` amend
    the config's ``[plan]`` as ``sharderd plan``'s flags do. ``serialize=False`` never rewrites a
    node into pieces, neither one too big for one device nor one whose own cost holds the
    bottleneck up (``--no-serialize``; see docs/how-it-works.md, "When one op is too big").

    Raises:
        PlanInfeasibleError: no split onto ``devices`` fits (exit code 3).
        ModelInvalidError, DimsUnresolvedError, ConfigError: bad model or arguments (exit code 2).
    """
    from sharderd.engine import analyze_file
    from sharderd.report.build import plan_section
    from sharderd.shard.serialize_bottleneck import planned

    cfg, target_name = _config(config, target, input_shapes, dims, batch_size, precision, serialize)
    with _model_file(model, _IN_MEMORY_STEM) as path:
        chosen, made = planned(
            analyze_file(path, cfg.plan), cfg.plan, cfg.target(target_name), devices
        )
    flow, stage_of = chosen.analysis.flow, made.assignment
    nodes: list[list[tuple[str, str]]] = [[] for _ in range(made.devices)]
    for i, (name, op) in enumerate(zip(flow.node_names, flow.op_types, strict=True)):
        nodes[int(stage_of[i])].append((name, op))
    return plan_from_section(plan_section(made, cfg.plan.batch_size), nodes)


def shard(
    model: Model,
    *,
    devices: int,
    out: str | os.PathLike[str],
    backend: Backend | None = None,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    serialize: bool = True,
    optimal_perf: bool | None = None,
    max_attempts: int | None = None,
    parallel: int | None = None,
    attempt_timeout: float | None = None,
    stem: str | None = None,
    config: Config | str | os.PathLike[str] | None = None,
    on_event: OnEvent | None = None,
) -> ShardResult:
    """Plan, prove on ``backend`` and write the sharded model into ``out``, as ``sharderd shard``.

    ``backend``, ``optimal_perf``, ``max_attempts``, ``parallel`` and ``attempt_timeout`` amend the
    config's ``[search]`` (``None``: the config's value; ``backend`` defaults to ``auto``). The files
    are named ``<stem>.sharded.onnx`` and ``<stem>.sharding.yaml``; ``stem`` defaults to the model
    file's name without ``.onnx`` (``model`` for a model in memory). Runs its own event loop: from
    async code, await ``shard_async`` instead.

    Raises:
        SharderdError: the job's error, by type (exit code as the CLI's). When compile attempts ran,
            their report is written to ``out`` (report.json, report.md, report.html) first.
    """
    import anyio

    async def run() -> ShardResult:
        return await shard_async(
            model,
            devices=devices,
            out=out,
            backend=backend,
            target=target,
            input_shapes=input_shapes,
            dims=dims,
            batch_size=batch_size,
            precision=precision,
            serialize=serialize,
            optimal_perf=optimal_perf,
            max_attempts=max_attempts,
            parallel=parallel,
            attempt_timeout=attempt_timeout,
            stem=stem,
            config=config,
            on_event=on_event,
        )

    return anyio.run(run)


async def shard_async(
    model: Model,
    *,
    devices: int,
    out: str | os.PathLike[str],
    backend: Backend | None = None,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    serialize: bool = True,
    optimal_perf: bool | None = None,
    max_attempts: int | None = None,
    parallel: int | None = None,
    attempt_timeout: float | None = None,
    stem: str | None = None,
    config: Config | str | os.PathLike[str] | None = None,
    on_event: OnEvent | None = None,
) -> ShardResult:
    """``shard`` for anyio or asyncio programs: the compiles run as subprocesses of this loop.
    Planning runs in this thread, as with the CLI: it blocks the loop while it plans."""
    from sharderd.job.run import JobFailed, JobSpec, run_local

    cfg, target_name = _config(config, target, input_shapes, dims, batch_size, precision, serialize)
    given: dict[str, Any] = {
        "backend": backend,
        "optimal_perf": optimal_perf,
        "max_attempts": max_attempts,
        "parallel": parallel,
        "attempt_timeout": attempt_timeout,
    }
    # SearchConfig checks each value as it checks a config file's
    amended = replace(cfg.search, **{k: v for k, v in given.items() if v is not None})
    cfg = replace(cfg, search=amended)
    search = search_options(cfg)
    out_dir = Path(out)
    with _model_file(model, stem or _IN_MEMORY_STEM) as path:
        spec = JobSpec(
            model=path,
            out_dir=out_dir,
            stem=stem or path.name.removesuffix(".onnx"),
            devices=devices,
            config=cfg,
            search=search,
            target=target_name,
        )
        try:
            done = await run_local(spec, emit=on_event or _ignore)
        except JobFailed as failed:
            raise failed.error from None
    return shard_result(done.report, out_dir, _written_stages(done.report, out_dir))


def _ignore(event: str, fields: Mapping[str, Any]) -> None:
    return None


def _config(
    config: Config | str | os.PathLike[str] | None,
    target: str | Target | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
    batch_size: int | None,
    precision: Precision | None,
    serialize: bool = True,
) -> tuple[Config, str | None]:
    """The config the call runs with, and the target's name in it (``None``: the config's)."""
    cfg = (
        config
        if isinstance(config, Config)
        else _load_config(None if config is None else Path(config))
    )
    cfg = amend_plan(
        cfg,
        input_shapes=input_shapes,
        dims=dims,
        batch_size=batch_size,
        precision=precision,
        no_serialize=not serialize,
    )
    if isinstance(target, Target):
        custom = {**cfg.custom_targets, target.name: target}
        return replace(cfg, custom_targets=custom), target.name
    return cfg, target


@contextmanager
def _model_file(model: Model, stem: str) -> Iterator[Path]:
    """A path to read ``model`` from: its own, or a temporary copy of a model in memory."""
    if isinstance(model, (str, os.PathLike)):
        yield Path(model)
        return
    import onnx

    from sharderd.examples.write import save

    if not isinstance(model, onnx.ModelProto):
        raise ConfigError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    with tempfile.TemporaryDirectory(prefix="sharderd-model-") as folder:
        # protobuf cannot write one message over 2 GiB: large weights go beside the file
        yield save(model, Path(folder) / f"{stem}.onnx", external_data=weights > 2**30)


def _written_stages(report: Mapping[str, Any], out: Path) -> list[list[tuple[str, str]]]:
    """(name, op type) of each stage's nodes in the written model; the ``Identity`` nodes that
    route a graph input to later stages (``plan.routed_inputs``) are not the model's own."""
    from sharderd.graph.load import read_structure
    from sharderd.shard.annotate import STAGE_ATTR

    routed = {r["node"] for r in report["plan"]["routed_inputs"]}
    written = read_structure(out / report["outputs"]["model"])
    nodes: list[list[tuple[str, str]]] = [[] for _ in report["plan"]["stages"]]
    for node in written.graph.node:
        if node.name in routed:
            continue
        stage = next(a.i for a in node.attribute if a.name == STAGE_ATTR)
        nodes[stage].append((node.name, node.op_type))
    return nodes
