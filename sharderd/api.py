"""The Python API: ``sharderd.plan``, ``sharderd.shard`` and their helpers (docs/python.md).

Each function is the work of a command: ``plan`` runs what ``sharderd plan`` runs, ``shard`` what
``sharderd shard`` runs (``job.run.run_local``, the same call), with arguments in place of flags.
The heavy modules (onnx, numpy, the engine) load on the first call, not on ``import sharderd``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

from sharderd.api_hints import Call
from sharderd.config import Config, amend_plan, search_options
from sharderd.config import load_config as _load_config
from sharderd.errors import ConfigError
from sharderd.results import Plan, ShardResult, plan_from_section, shard_result
from sharderd.target import BUILTIN_TARGETS, Target

if TYPE_CHECKING:
    from types import FrameType

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
    devices: int | Literal["auto"],
    max_devices: int | None = None,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    safety_margin: float | None = None,
    name_nodes: bool = False,
    serialize: bool = True,
    config: Config | str | os.PathLike[str] | None = None,
) -> Plan:
    """Split ``model`` into ``devices`` pipeline stages; compile nothing, write nothing.
    ``devices="auto"`` with ``max_devices=N`` (``--devices auto --max-devices N``) plans on the
    fewest devices, at most N, whose predicted throughput is within 1% of a plan on N.

    ``target`` is a name (``targets()``) or a ``Target``; ``None`` takes the config's ``[target]``
    (``ipu-mk2`` by default). ``input_shapes``, ``dims``, ``batch_size``, ``precision`` and
    ``safety_margin`` amend the config's ``[plan]`` as ``sharderd plan``'s flags do;
    ``name_nodes=True`` names unnamed or duplicate nodes ``<OpType>_<k>`` instead of refusing the
    model (``--name-nodes``). ``serialize=False`` never rewrites a node into pieces, neither one too
    big for one device nor one whose own cost holds the bottleneck up (``--no-serialize``). A
    symbolic leading dim nothing sets is planned at the default ``batch_size`` (1), with a
    ``UserWarning`` naming it. A split the estimate says overflows comes back with
    ``method == "overfull"`` (``sharderd plan`` prints it and exits 5): ``shard`` with a compile
    backend lets the compiler decide.

    Raises:
        ConfigError: a bad argument or config value (exit code 2).
        ModelInvalidError: the model cannot be read, or breaks a rule sharderd needs, e.g.
            unnamed nodes without ``name_nodes=True`` (exit code 2).
        DimsUnresolvedError: a symbolic input dim nothing gives a value (exit code 2).
        NotProvenError: no fitting split found on ``devices``, and none is proven impossible:
            the common "does not fit" of an estimate; ``err.min_devices`` is the count the
            estimate suggests, when known (exit code 5).
        PlanInfeasibleError: proven not to fit on ``devices`` (``err.grounds``: the weights alone)
            (exit code 3). Both are ``NoSplitError``.

    Each error's ``hint`` is a call that gets past it, in Python terms.
    """
    from sharderd.engine import analyze_file, make_auto_plan
    from sharderd.report.assumptions import defaulted_dims
    from sharderd.report.build import model_facts, plan_section
    from sharderd.shard.serialize_bottleneck import planned

    call = Call("plan", model, dict(locals()), _FUNCTIONS)
    with call.hints():
        cfg, target_name = _config(call.arguments)
        count, auto = device_request(devices, max_devices)
        target_value = cfg.target(target_name)
        with _model_file(model, _IN_MEMORY_STEM) as path:
            chosen, made = planned(analyze_file(path, cfg.plan), cfg.plan, target_value, count)
        if auto:  # as `--devices auto`: serialization decided at the most, then the fewest
            made = make_auto_plan(chosen.analysis, target_value, count, cfg.plan)
        _warn(defaulted_dims(model_facts(chosen.analysis)["inputs"], cfg))
    flow, stage_of = chosen.analysis.flow, made.assignment
    nodes: list[list[tuple[str, str]]] = [[] for _ in range(made.devices)]
    for i, (name, op) in enumerate(zip(flow.node_names, flow.op_types, strict=True)):
        nodes[int(stage_of[i])].append((name, op))
    return plan_from_section(plan_section(made, cfg.plan.batch_size), nodes)


def shard(
    model: Model,
    *,
    devices: int | Literal["auto"],
    max_devices: int | None = None,
    out: str | os.PathLike[str],
    backend: Backend | None = None,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    safety_margin: float | None = None,
    name_nodes: bool = False,
    keep_dynamic: bool = False,
    serialize: bool = True,
    optimal_perf: bool | None = None,
    max_attempts: int | None = None,
    parallel: int | None = None,
    attempt_timeout: float | None = None,
    overwrite: bool = False,
    stem: str | None = None,
    config: Config | str | os.PathLike[str] | None = None,
    on_event: OnEvent | None = None,
) -> ShardResult:
    """Plan, prove on ``backend`` and write the sharded model into ``out``, as ``sharderd shard``.

    Takes ``plan``'s arguments, and ``keep_dynamic=True`` to write the model with the input dims
    as the file has them (``--keep-dynamic``). ``backend``, ``optimal_perf``, ``max_attempts``,
    ``parallel`` and ``attempt_timeout`` amend the config's ``[search]`` (``None``: the config's
    value; ``backend`` defaults to ``auto``: poprt for an IPU target when it imports, else
    onnxruntime, with a warning in the report). An ``out`` that holds an earlier result is refused
    unless ``overwrite=True`` (files of the same names are replaced, others stay). The files are
    named ``<stem>.sharded.onnx`` and ``<stem>.sharding.yaml``; ``stem`` defaults to the model
    file's name without ``.onnx`` (``model`` for a model in memory). Runs its own event loop: from
    async code, await ``shard_async`` instead.

    Raises:
        ConfigError, ModelInvalidError, DimsUnresolvedError: as ``plan``; also an ``out`` holding
            an earlier result (exit code 2).
        NotProvenError, PlanInfeasibleError: as ``plan``, and from what the compiles showed
            (exit codes 5 and 3).
        BackendUnavailableError: the backend asked for cannot run here (exit code 4).
        CompileFailedError: every compile failed for a reason other than memory (exit code 1).
        VerificationError: onnxruntime's outputs differ from the model's (exit code 1).
        OutputWriteError: the results could not be written (exit code 1).

    When the model was read, the report of the failed job (its verdict, error and attempts) is
    in ``out`` (report.json, report.md, report.html) before the error is raised. Each error's
    ``hint`` is a call that gets past it, in Python terms.
    """
    options = dict(locals())
    import anyio

    async def run() -> ShardResult:
        return await shard_async(**options)

    return anyio.run(run)


async def shard_async(
    model: Model,
    *,
    devices: int | Literal["auto"],
    max_devices: int | None = None,
    out: str | os.PathLike[str],
    backend: Backend | None = None,
    target: str | Target | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    batch_size: int | None = None,
    precision: Precision | None = None,
    safety_margin: float | None = None,
    name_nodes: bool = False,
    keep_dynamic: bool = False,
    serialize: bool = True,
    optimal_perf: bool | None = None,
    max_attempts: int | None = None,
    parallel: int | None = None,
    attempt_timeout: float | None = None,
    overwrite: bool = False,
    stem: str | None = None,
    config: Config | str | os.PathLike[str] | None = None,
    on_event: OnEvent | None = None,
) -> ShardResult:
    """``shard`` for anyio or asyncio programs: the compiles run as subprocesses of this loop.
    Planning runs in this thread, as with the CLI: it blocks the loop while it plans. Raises as
    ``shard``."""
    from sharderd.backends.registry import fallback_warnings
    from sharderd.job.outdir import check_model_file, occupied
    from sharderd.job.run import JobFailed, JobSpec, run_local
    from sharderd.report.assumptions import defaulted_dims

    call = Call("shard", model, dict(locals()), _FUNCTIONS)
    with call.hints():
        cfg, target_name = _config(call.arguments)
        # SearchConfig checks each value as it checks a config file's
        given = {k: call.arguments[k] for k in _SEARCH_KEYWORDS if call.arguments[k] is not None}
        cfg = replace(cfg, search=replace(cfg.search, **given))
        search = search_options(cfg)
        out_dir = Path(out)
        with _model_file(model, stem or _IN_MEMORY_STEM) as path:
            check_model_file(path)
            count, auto = device_request(devices, max_devices)
            spec = JobSpec(
                model=path,
                out_dir=out_dir,
                stem=stem or path.name.removesuffix(".onnx"),
                devices=count,
                auto_devices=auto,
                config=cfg,
                search=search,
                target=target_name,
            )
            problem = None if overwrite else occupied(out_dir, spec.stem)
            if problem is not None:
                raise ConfigError(problem, reruns=({"overwrite": True},))
            try:
                done = await run_local(spec, emit=on_event or _ignore)
            except JobFailed as failed:
                raise failed.error from None
    target_value = cfg.target(target_name)
    _warn(fallback_warnings(search.backend, str(done.report["backend"]), target_value))
    _warn(defaulted_dims(done.report["model"]["inputs"], cfg))
    return shard_result(done.report, out_dir, _written_stages(done.report, out_dir))


def device_request(devices: int | str, max_devices: int | None) -> tuple[int, bool]:
    """(devices, auto), as the CLI's ``--devices``/``--max-devices``: ``devices="auto"`` plans on
    at most ``max_devices`` and keeps the fewest that give the same predicted throughput."""
    if devices != "auto":
        if max_devices is not None:
            raise ConfigError(
                "max_devices applies to devices='auto' only",
                reruns=({"max_devices": None}, {"devices": "auto"}),
            )
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise ConfigError(f"devices must be an int or 'auto', got {devices!r}")
        return devices, False
    if max_devices is None or max_devices < 1:
        raise ConfigError(
            f"devices='auto' needs max_devices >= 1, the most devices it may use, got {max_devices}",
            reruns=({"max_devices": 8},),
        )
    return max_devices, True


def _ignore(event: str, fields: Mapping[str, Any]) -> None:
    return None


def _warn(texts: Sequence[str]) -> None:
    """What a run assumed, as Python warnings pointing at the caller's line: the first frame
    outside sharderd and the event loop ``shard`` runs (``shard_async`` awaited from anyio or
    asyncio: the caller's coroutine)."""
    import asyncio

    import anyio

    import sharderd

    ours = tuple(str(Path(str(m.__file__)).parent) + os.sep for m in (sharderd, anyio, asyncio))
    level, frame = 1, cast("FrameType | None", sys._getframe(1))
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        level, frame = level + 1, frame.f_back
    for text in texts:
        warnings.warn(text, UserWarning, stacklevel=level + 1)


_PLAN_KEYWORDS = ("input_shapes", "dims", "batch_size", "precision", "safety_margin", "name_nodes")
"""The keywords of ``plan`` and ``shard`` that amend ``[plan]`` under their own names."""
_SEARCH_KEYWORDS = ("backend", "optimal_perf", "max_attempts", "parallel", "attempt_timeout")
"""``shard``'s keywords that amend ``[search]``."""


def _config(arguments: Mapping[str, Any]) -> tuple[Config, str | None]:
    """The config a call runs with (its ``config`` amended by its ``[plan]`` keywords), and the
    target's name in it (``None``: the config's)."""
    config, target = arguments["config"], arguments["target"]
    cfg = (
        config
        if isinstance(config, Config)
        else _load_config(None if config is None else Path(config))
    )
    cfg = amend_plan(
        cfg,
        **{k: arguments[k] for k in _PLAN_KEYWORDS},
        keep_dynamic=arguments.get("keep_dynamic", False),  # shard's only
        no_serialize=not arguments["serialize"],
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


_FUNCTIONS: Mapping[str, Callable[..., Any]] = {"plan": plan, "shard": shard}
"""What a hint may call (``api_hints.Call``): its parameters' defaults come from these signatures."""
