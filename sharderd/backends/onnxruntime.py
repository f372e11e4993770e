"""The onnxruntime backend, child side: split, build, verify and time the stages of a plan.

"Compiling" a plan is building one ``InferenceSession`` per stage (stage i on device i when the
provider has devices). Every stage then runs once on generated inputs, so a stage that cannot
allocate its activations fails here, not in production. Verification compares every graph
output with the unsharded model run on the same inputs; a difference is an ``invalid``
outcome naming the output, never a silent pass. Measuring times each stage and the stages as a
concurrent pipeline; profiling times every node with onnxruntime's own profiler so the planner
can re-plan with measured costs.

Memory: by default all stage sessions exist at once (built before anything runs, so a build
failure costs nothing). With ``low_memory`` the reference session is released before the first
stage session is built and each stage session before the next, so the peak is one of them,
never the whole model twice; the concurrent pipeline is then estimated from the stage times.

``onnxruntime`` is imported inside ``run_attempt`` only: the parent asks ``available()``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnx

from sharderd.backends.ort_pipeline import Step, iqr, time_calls, time_pipeline
from sharderd.backends.protocol import (
    AttemptOutcome,
    AttemptRequest,
    BenchmarkResult,
    OomInfo,
    Outcome,
)
from sharderd.errors import ConfigError, ModelInvalidError, SharderdError
from sharderd.graph.load import parse_model_bytes
from sharderd.graph.tensors import all_tensors, tensor_nbytes
from sharderd.shard.split import (
    StageModel,
    external_locations,
    infer_value_infos,
    split_stages,
    strip_annotations,
    write_stages,
)

__all__ = [
    "NOT_INSTALLED",
    "OrtOptions",
    "OutputCheck",
    "available",
    "compare_outputs",
    "index_bounds",
    "make_inputs",
    "node_times_from_trace",
    "run_attempt",
]

NOT_INSTALLED = (
    "onnxruntime is not installed: pip install 'sharderd[onnxruntime]' (or onnxruntime-gpu)"
)

_DEVICE_PROVIDERS = frozenset(
    {
        "CUDAExecutionProvider",
        "ROCMExecutionProvider",
        "TensorrtExecutionProvider",
        "MIGraphXExecutionProvider",
        "DmlExecutionProvider",
    }
)
"""Providers with a ``device_id`` option: stage i runs on device i."""
_MEMORY_LIMITED = frozenset({"CUDAExecutionProvider", "ROCMExecutionProvider"})
"""Providers that take ``gpu_mem_limit``."""
_ALLOCATION_FAILED = re.compile(
    r"failed to allocate memory|out of memory|bad_alloc|available memory of \d+ is smaller than requested",
    re.IGNORECASE,
)
_PASS_THROUGH = frozenset(
    {
        "Identity",
        "Cast",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Expand",
        "Transpose",
        "Tile",
    }
)
"""Ops that carry index values through unchanged, between a graph input and a Gather."""
_SMALL_INT = 4
"""Integer inputs that index nothing get values in [0, 4): small, valid as counts or ids."""
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
"""Where a model built from bytes finds its external data."""
_QUIET = 3
"""onnxruntime log severity: errors only (they reach us as exceptions anyway)."""


@dataclass(frozen=True, slots=True)
class OrtOptions:
    """The backend's options, from ``AttemptRequest.options`` (same names) and the request."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    reference_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """Where the unsharded reference runs; the CPU by default, so it takes no device memory."""
    reference_model: str | None = None
    """The model the stages must agree with; default the annotated model itself."""
    rtol: float = 1e-3
    atol: float = 1e-4
    warmup: int = 3
    runs: int = 20
    """Timed runs per stage, and micro-batches through the pipeline."""
    profile_runs: int = 10
    low_memory: bool = False
    seed: int = 0
    verify: bool = True
    measure: bool = False
    profile: bool = False
    """Per-node times from onnxruntime's profiler, graph optimizations off so nodes keep their names."""
    gpu_mem_limit: int | None = None
    """Bytes per device; an allocation failure is then ``oom`` on the stage's device."""
    write_stages_dir: str | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    """Values of named symbolic input dims; a leading unnamed one is the batch size."""
    intra_op_threads: int = 0
    """Threads per stage session; 0: the CPU's cores shared out between the stages."""
    batch_size: int = 1

    @classmethod
    def from_request(cls, request: AttemptRequest) -> OrtOptions:
        """Request fields give the defaults of ``warmup``, ``runs``, ``measure`` and ``batch_size``."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {
            "warmup": request.warmup,
            "runs": request.runs,
            "measure": request.benchmark,
            "batch_size": request.batch_size,
        }
        for key, value in request.options.items():
            if key not in known:
                raise ConfigError(
                    f"unknown onnxruntime option {key!r} (known: {', '.join(sorted(known))})"
                )
            values[key] = value
        try:
            for key in ("providers", "reference_providers"):
                if key in values:
                    given = values[key]
                    values[key] = (given,) if isinstance(given, str) else tuple(given)
            if "dims" in values:
                values["dims"] = {str(k): int(v) for k, v in dict(values["dims"]).items()}
            options = cls(**values)
            options.check()
        except (TypeError, ValueError) as exc:  # a value of the wrong type (JSON from a sidecar)
            raise ConfigError(f"onnxruntime options: {exc}") from None
        return options

    def check(self) -> None:
        problems = [
            (not self.providers, "providers must name at least one execution provider"),
            (self.rtol < 0 or self.atol < 0, "rtol and atol must be >= 0"),
            (
                self.warmup < 0 or self.runs < 1 or self.profile_runs < 1,
                "warmup must be >= 0, runs and profile_runs >= 1",
            ),
            (
                self.gpu_mem_limit is not None and self.gpu_mem_limit <= 0,
                "gpu_mem_limit must be > 0 bytes",
            ),
            (
                self.batch_size < 1 or self.intra_op_threads < 0,
                "batch_size must be >= 1, intra_op_threads >= 0",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(f"onnxruntime options: {message}")


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """One graph output, stages against the reference."""

    name: str
    passed: bool
    max_abs: float
    max_rel: float
    """Relative to ``max(|reference|, atol)``, so exact zeros in the reference do not divide by 0."""
    exact: bool
    """Compared for equality (integers, bools), not within tolerances."""
    problem: str = ""
    """Why it failed before any number was compared (missing, other shape or dtype)."""


class _Failure(Exception):
    """Ends an attempt with a verdict; caught in ``run_attempt`` only."""

    def __init__(self, outcome: Outcome, message: str, oom: OomInfo | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.oom = oom


def available() -> bool:
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):
        return False


def run_attempt(request: AttemptRequest) -> AttemptOutcome:
    """Split ``request.model``, build a session per stage, run, verify, measure and profile as asked."""
    try:
        import onnxruntime
    except ImportError:
        return AttemptOutcome("invalid", message=NOT_INSTALLED)
    details: dict[str, Any] = {}
    try:
        options = OrtOptions.from_request(request)
        return _attempt(onnxruntime, request, options, details)
    except _Failure as failure:
        return AttemptOutcome(
            failure.outcome, message=failure.message, oom=failure.oom, details=details
        )
    except SharderdError as err:
        return AttemptOutcome("invalid", message=str(err), details=details)


def _attempt(
    ort: Any, request: AttemptRequest, options: OrtOptions, details: dict[str, Any]
) -> AttemptOutcome:
    model_path = Path(request.model)
    model = _load(model_path)
    stages = split_stages(model, model_path.parent)
    details["stages"] = [
        {
            "index": s.index,
            "nodes": len(s.model.graph.node),
            "inputs": list(s.inputs),
            "outputs": list(s.outputs),
            "initializers": len(s.model.graph.initializer),
        }
        for s in stages
    ]
    if len(stages) > request.num_devices:
        raise _Failure(
            "invalid",
            f"the model has {len(stages)} pipeline stages but the attempt has {request.num_devices} device(s)",
        )
    artifact = None
    if options.write_stages_dir:
        stem = model_path.name.removesuffix(".onnx").removesuffix(".sharded")
        paths = write_stages(stages, Path(options.write_stages_dir), stem=stem)
        details["stage_files"] = [str(p) for p in paths]
        artifact = options.write_stages_dir
    runner = _Runner(ort, options, len(stages))
    details.update(
        providers=list(options.providers),
        threads_per_stage=runner.threads,
        low_memory=options.low_memory,
    )

    sessions = [] if options.low_memory else [runner.create(s) for s in stages]
    feeds = make_inputs(model, batch_size=options.batch_size, dims=options.dims, seed=options.seed)
    details["inputs"] = {
        name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in feeds.items()
    }
    reference = None
    if options.verify:
        reference_path = Path(options.reference_model) if options.reference_model else model_path
        reference = _reference_outputs(ort, reference_path, feeds, options)

    env: dict[str, Any] = dict(feeds)
    times: list[np.ndarray | None] = []
    node_times: dict[str, float] = {}
    for stage in stages:
        session = sessions[stage.index] if sessions else runner.create(stage)
        env.update(runner.run(session, stage, env))
        if options.low_memory:
            times.append(runner.time_stage(session, stage, env))
        del session  # with low_memory: released before any other session is built
        if options.low_memory:
            node_times.update(runner.profile(stage, env))

    message = f"{len(stages)} stage session(s) built with {', '.join(options.providers)}"
    if reference is not None:
        checks = compare_outputs(reference, env, rtol=options.rtol, atol=options.atol)
        details["verification"] = {
            "passed": all(c.passed for c in checks),
            "rtol": options.rtol,
            "atol": options.atol,
            "outputs": {c.name: asdict(c) for c in checks},
        }
        failed = [c for c in checks if not c.passed]
        if failed:
            raise _Failure(
                "invalid",
                "verification failed: " + "; ".join(_describe(c, options) for c in failed),
            )
        worst = max((c.max_abs for c in checks), default=0.0)
        message += f"; verified {len(checks)} output(s), max abs error {worst:.2g}"

    if not options.low_memory:
        for stage, session in zip(stages, sessions, strict=True):
            times.append(runner.time_stage(session, stage, env))
            node_times.update(runner.profile(stage, env))
    if options.profile:
        details["node_times_s"] = node_times
    benchmark = None
    if options.measure:
        benchmark = _benchmark(stages, sessions, times, feeds, options, details)
        message += (
            f"; {benchmark.throughput_per_s:.4g} samples/s, stage medians "
            + ", ".join(f"{t * 1e3:.3g}" for t in benchmark.stage_times_s)
            + " ms"
        )
    return AttemptOutcome(
        "ok", message=message, artifact=artifact, benchmark=benchmark, details=details
    )


def _benchmark(
    stages: Sequence[StageModel],
    sessions: Sequence[_Session],
    times: Sequence[np.ndarray | None],
    feeds: Mapping[str, Any],
    options: OrtOptions,
    details: dict[str, Any],
) -> BenchmarkResult:
    """Latency is the sum of stage medians; throughput comes from the concurrent pipeline."""
    # Samples per run: the leading dim of the inputs, which a static batch fixes, not options.
    leading = [a.shape[0] for a in feeds.values() if np.ndim(a) > 0]
    samples = int(leading[0]) if leading else options.batch_size
    measured = [t for t in times if t is not None]
    medians = [float(np.median(t)) for t in measured]
    spreads = [iqr(t) for t in measured]
    details["stage_times_s"] = medians
    details["stage_spread_s"] = spreads
    if sessions:
        timing = time_pipeline(
            [_step(session, stage) for stage, session in zip(stages, sessions, strict=True)],
            feeds,
            items=options.runs,
        )
        throughput = samples * timing.items_per_s
        details["pipeline"] = {
            "measured": True,
            "samples_per_run": samples,
            "items": timing.items,
            "wall_s": timing.wall_s,
            "throughput_per_s": throughput,
        }
    else:
        throughput = samples / max(medians) if max(medians) > 0 else 0.0
        details["pipeline"] = {
            "measured": False,
            "samples_per_run": samples,
            "throughput_per_s": throughput,
            "note": "low_memory: stage sessions never coexist; throughput = batch / slowest stage",
        }
    return BenchmarkResult(
        latency_s=sum(medians),
        throughput_per_s=throughput,
        runs=options.runs,
        stage_times_s=tuple(medians),
        spread_s=sum(spreads),
    )


def _step(session: _Session, stage: StageModel) -> Step:
    outputs, inputs = list(stage.outputs), stage.inputs

    def step(env: Mapping[str, Any]) -> Mapping[str, Any]:
        values = session.run(outputs, {name: env[name] for name in inputs})
        return {**env, **dict(zip(outputs, values, strict=True))}

    return step


class _Runner:
    """Builds and runs stage sessions with the attempt's providers; ORT errors become verdicts."""

    __slots__ = ("options", "ort", "threads")

    def __init__(self, ort: Any, options: OrtOptions, n_stages: int) -> None:
        self.ort = ort
        self.options = options
        self.threads = options.intra_op_threads or max(1, (os.cpu_count() or 1) // n_stages)
        here = set(ort.get_available_providers())
        missing = [p for p in (*options.providers, *options.reference_providers) if p not in here]
        if missing:
            raise _Failure(
                "invalid",
                f"execution provider(s) {missing} are not available here (available: {sorted(here)})",
            )

    def create(self, stage: StageModel, *, profile_dir: Path | None = None) -> _Session:
        ort, i = self.ort, stage.index
        so = ort.SessionOptions()
        so.log_severity_level = _QUIET
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        if profile_dir is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(profile_dir / f"stage{i}")
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        providers = list(self.options.providers)
        try:
            session = _Session.build(
                ort,
                stage.model,
                stage.base_dir,
                so,
                providers,
                [self._provider_options(p, i) for p in providers],
            )
        except Exception as exc:  # onnxruntime's exceptions share no base class but Exception
            raise self._failure(exc, i, "build a session for") from None
        used = session.session.get_providers()
        fallback = [p for p in providers if p not in used]
        if fallback:
            raise _Failure(
                "invalid",
                f"stage {i}: onnxruntime could not use {fallback} on device {i} (it fell back to {used})",
            )
        return session

    def run(self, session: _Session, stage: StageModel, env: Mapping[str, Any]) -> dict[str, Any]:
        try:
            values = session.run(list(stage.outputs), {name: env[name] for name in stage.inputs})
        except Exception as exc:
            raise self._failure(exc, stage.index, "run") from None
        return dict(zip(stage.outputs, values, strict=True))

    def time_stage(
        self, session: _Session, stage: StageModel, env: Mapping[str, Any]
    ) -> np.ndarray | None:
        """Seconds per run of one stage on its real inputs; None unless measuring."""
        if not self.options.measure:
            return None
        outputs, feed = list(stage.outputs), {name: env[name] for name in stage.inputs}
        return time_calls(
            lambda: session.run(outputs, feed), warmup=self.options.warmup, runs=self.options.runs
        )

    def profile(self, stage: StageModel, env: Mapping[str, Any]) -> dict[str, float]:
        """Median seconds per node of one stage, from a session of its own; empty unless profiling."""
        if not self.options.profile:
            return {}
        with tempfile.TemporaryDirectory(prefix="sharderd-profile-") as folder:
            session = self.create(stage, profile_dir=Path(folder))
            for _ in range(self.options.warmup + self.options.profile_runs):
                self.run(session, stage, env)
            trace_path = Path(session.session.end_profiling())
            del session
            trace = json.loads(trace_path.read_text(encoding="utf-8"))
        return node_times_from_trace(trace, stage.node_names, skip=self.options.warmup)

    def _provider_options(self, provider: str, device: int) -> dict[str, str]:
        if provider not in _DEVICE_PROVIDERS:
            return {}
        values = {"device_id": str(device)}
        if provider in _MEMORY_LIMITED and self.options.gpu_mem_limit is not None:
            values["gpu_mem_limit"] = str(self.options.gpu_mem_limit)
        return values

    def _failure(self, exc: Exception, stage: int, doing: str) -> _Failure:
        """An allocation failure under a memory cap is ``oom`` on the stage's device.

        onnxruntime names no tile and no byte count that fits ``OomInfo``, so the kind is
        ``variables``, the numberless out-of-memory form: the search loop moves work off the
        device without a number to size the move.
        """
        text = _text(exc)
        limit = self.options.gpu_mem_limit
        if limit is not None and _ALLOCATION_FAILED.search(text):
            return _Failure(
                "oom",
                f"stage {stage} does not fit on device {stage} (gpu_mem_limit {limit} bytes): {text}",
                OomInfo("variables", device=stage),
            )
        return _Failure("invalid", f"stage {stage}: onnxruntime cannot {doing} it: {text}")


def _reference_outputs(
    ort: Any, path: Path, feeds: Mapping[str, Any], options: OrtOptions
) -> dict[str, Any]:
    """The unsharded model's outputs; its session is gone when this returns."""
    model = _load(path)
    strip_annotations(model.graph)  # onnxruntime's fusions trip over them (see shard.split)
    so = ort.SessionOptions()
    so.log_severity_level = _QUIET
    try:
        session = _Session.build(ort, model, path.parent, so, list(options.reference_providers))
        inputs = [i.name for i in session.session.get_inputs()]
        missing = [name for name in inputs if name not in feeds]
        if missing:
            raise _Failure(
                "invalid",
                f"the reference model {path.name} needs inputs the sharded model does not have: {missing}",
            )
        names = [o.name for o in session.session.get_outputs()]
        values = session.run(names, {name: feeds[name] for name in inputs})
    except _Failure:
        raise
    except Exception as exc:
        raise _Failure(
            "invalid", f"the unsharded model {path.name} does not run in onnxruntime: {_text(exc)}"
        ) from None
    return dict(zip(names, values, strict=True))


class _Session:
    """An ``InferenceSession`` and any weight buffers it reads, which must outlive it.

    onnxruntime memory-maps external data itself, lazily, when it may open the files: a stage is
    built from bytes with its model's folder as the external-data folder. It refuses data files
    that are symlinks or have several hard links (how attempt folders may share a model's data).
    A symlinked folder is followed to the real one; hard-linked files are mapped here and handed
    over with ``add_external_initializers``, which costs a copy inside onnxruntime, and tensors
    in If/Loop bodies are then read into the proto (small by nature).
    """

    __slots__ = ("buffers", "session")

    def __init__(self, session: Any, buffers: list[Any]) -> None:
        self.session = session
        self.buffers = buffers

    @classmethod
    def build(
        cls,
        ort: Any,
        model: onnx.ModelProto,
        base_dir: Path,
        so: Any,
        providers: list[str],
        provider_options: list[dict[str, str]] | None = None,
    ) -> _Session:
        buffers: list[Any] = []
        locations = external_locations(model)
        folder = _data_folder(base_dir, locations) if locations and _folder_option(ort) else None
        if folder is not None:
            so.add_session_config_entry(_EXTERNAL_FOLDER, str(folder))
        elif locations:
            model, buffers = _hand_over_weights(ort, model, base_dir, so)
        session = ort.InferenceSession(
            model.SerializeToString(), so, providers=providers, provider_options=provider_options
        )
        return cls(session, buffers)

    def run(self, outputs: list[str], feed: Mapping[str, Any]) -> list[Any]:
        return self.session.run(outputs, feed)


def _folder_option(ort: Any) -> bool:
    """Whether this onnxruntime reads ``_EXTERNAL_FOLDER`` (added in 1.18)."""
    try:
        major, minor = (int(x) for x in ort.__version__.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) >= (1, 18)


def _data_folder(base_dir: Path, locations: Sequence[str]) -> Path | None:
    """A folder holding every location as a plain file onnxruntime accepts, or None.

    ``base_dir`` itself, else the one real folder its symlinks lead to.
    """
    candidates: set[Path] = set()
    for location in locations:
        path = base_dir / location
        if _plain_file(path):
            candidates.add(base_dir)
            continue
        real = Path(os.path.realpath(path))
        parts = PurePosixPath(location.replace("\\", "/")).parts
        if not _plain_file(real) or real.parts[-len(parts) :] != parts:
            return None
        candidates.add(Path(*real.parts[: -len(parts)]))
    return candidates.pop() if len(candidates) == 1 else None


def _plain_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _hand_over_weights(
    ort: Any, model: onnx.ModelProto, base_dir: Path, so: Any
) -> tuple[onnx.ModelProto, list[Any]]:
    """Map top-level external initializers for ``add_external_initializers``; inline the rest."""
    names, values, buffers = [], [], []
    unmapped = set()
    for tensor in model.graph.initializer:
        if not _is_external(tensor):
            continue
        array = _map_tensor(tensor, base_dir)
        if array is None:
            unmapped.add(tensor.name)
            continue
        names.append(tensor.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
        buffers.append(array)
    if unmapped or any(_is_external(t) for t in _nested_tensors(model.graph)):
        model = _with_inlined(model, base_dir, unmapped)
    if names:
        so.add_external_initializers(names, values)
    return model, [*buffers, *values]


def _load(path: Path) -> onnx.ModelProto:
    """The model proto without its weights.

    Not ``load_model``: the parent validated the job already, and attempt folders may reach the
    data through a symlink that points outside them. Locations are still held to relative paths
    without ``..``.
    """
    try:
        model = parse_model_bytes(path.read_bytes(), str(path))
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
    for owner, tensor in all_tensors(model.graph):
        if _is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            pure = PurePosixPath(location.replace("\\", "/"))
            if not location or pure.is_absolute() or ".." in pure.parts:
                raise ModelInvalidError(
                    f"tensor {tensor.name or owner!r}: external data location {location!r} must be "
                    "a relative path inside the model's folder"
                )
    return model


def _map_tensor(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray | None:
    """A read-only memory map of an external tensor; None for dtypes numpy cannot map."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.kind not in "biufc":
        return None
    shape = tuple(tensor.dims)
    if math.prod(shape) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(
        base_dir / info["location"],
        dtype=dtype,
        mode="r",
        offset=int(info.get("offset", "0")),
        shape=shape,
    )


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _nested_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Tensors held by nodes: Constant/attribute values and everything inside bodies."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from (t for _, t in all_tensors(attr.g))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    yield from (t for _, t in all_tensors(body))


def _with_inlined(model: onnx.ModelProto, base_dir: Path, names: set[str]) -> onnx.ModelProto:
    """A copy whose nested external tensors, and the initializers in ``names``, hold their bytes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    top = [t for t in copy.graph.initializer if t.name in names and _is_external(t)]
    for tensor in [*top, *(t for t in _nested_tensors(copy.graph) if _is_external(t))]:
        tensor.raw_data = _read_external(tensor, base_dir)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return copy


def _read_external(tensor: onnx.TensorProto, base_dir: Path) -> bytes:
    """The bytes of an external tensor (onnx's own reader refuses hard-linked files too)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    length = int(info["length"]) if "length" in info else tensor_nbytes(tensor)
    with open(base_dir / info["location"], "rb") as f:
        f.seek(int(info.get("offset", "0")))
        return f.read(length)


def make_inputs(
    model: onnx.ModelProto, *, batch_size: int, dims: Mapping[str, int], seed: int
) -> dict[str, np.ndarray]:
    """Seeded values for every graph input, in range for what reads them.

    Integers that index a Gather stay below the indexed dim (token ids below the vocabulary);
    inputs named like ``*mask*`` are 0/1; other integers are small and non-negative; floats are
    normal with standard deviation 0.5.
    """
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    bounds = index_bounds(model)
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        if not value.type.HasField("tensor_type"):
            raise ModelInvalidError(
                f"graph input {value.name!r} is not a tensor; cannot generate values for it"
            )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        shape = _input_shape(value, batch_size, dims)
        if "mask" in value.name.lower() and dtype.kind in "biuf":
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(
                0, max(bounds.get(value.name, _SMALL_INT), 1), shape
            ).astype(dtype)
        elif dtype.kind == "f":
            feeds[value.name] = (rng.standard_normal(shape) * 0.5).astype(dtype)
        else:
            raise ModelInvalidError(
                f"graph input {value.name!r} has type {dtype}; cannot generate values for it"
            )
    return feeds


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input → exclusive upper bound for its values, for inputs that end up as Gather indices.

    Follows each input through ops that keep values (Identity, Cast, Reshape...) to every Gather
    that uses it as indices, and takes the smallest indexed dim.
    """
    graph = model.graph
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((node, k))
    shapes: dict[str, list[int]] = {t.name: list(t.dims) for t in graph.initializer}
    inferred: dict[str, onnx.ValueInfoProto] | None = None
    bounds: dict[str, int] = {}
    for value in graph.input:
        stack, seen = [value.name], {value.name}
        while stack:
            for node, k in readers.get(stack.pop(), ()):
                if node.op_type in _PASS_THROUGH and k == 0:
                    fresh = [o for o in node.output if o and o not in seen]
                    seen.update(fresh)
                    stack.extend(fresh)
                elif node.op_type == "Gather" and k == 1:
                    data = node.input[0]
                    if data not in shapes:
                        inferred = infer_value_infos(model) if inferred is None else inferred
                        shapes[data] = _static_dims(inferred.get(data))
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    dims = shapes[data]
                    if -len(dims) <= axis < len(dims) and dims[axis] > 0:
                        bounds[value.name] = min(bounds.get(value.name, dims[axis]), dims[axis])
    return bounds


def compare_outputs(
    reference: Mapping[str, Any], got: Mapping[str, Any], *, rtol: float, atol: float
) -> list[OutputCheck]:
    """Check every reference output: equal for integers and bools, ``allclose`` for floats."""
    checks = []
    for name, ref_value in reference.items():
        ref = np.asarray(ref_value)
        exact = ref.dtype.kind not in "fc"
        if name not in got:
            checks.append(OutputCheck(name, False, np.inf, np.inf, exact, "no stage produces it"))
            continue
        out = np.asarray(got[name])
        if out.shape != ref.shape or out.dtype != ref.dtype:
            problem = f"{out.dtype}{list(out.shape)} instead of {ref.dtype}{list(ref.shape)}"
            checks.append(OutputCheck(name, False, np.inf, np.inf, exact, problem))
            continue
        if ref.dtype.kind not in "biufc":  # strings and objects: equal or not
            diff, scale = (out != ref).astype(np.float64), 1.0
            checks.append(OutputCheck(name, not diff.any(), *_maxima(diff, scale), exact))
            continue
        wide = np.complex128 if ref.dtype.kind == "c" else np.float64
        a, b = out.astype(wide), ref.astype(wide)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(a == b, 0.0, np.abs(a - b))
        diff[np.isnan(diff)] = np.inf  # NaN on one side only
        diff[np.isnan(a) & np.isnan(b)] = 0.0
        if exact:
            scale = np.fmax(np.abs(b), 1.0)
            passed = bool(np.array_equal(out, ref))
        else:
            scale = np.fmax(np.abs(b), atol if atol > 0 else np.finfo(np.float64).tiny)
            passed = bool(np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True))
        checks.append(OutputCheck(name, passed, *_maxima(diff, scale), exact))
    return checks


def _maxima(diff: np.ndarray, scale: np.ndarray | float) -> tuple[float, float]:
    if not diff.size:
        return 0.0, 0.0
    return float(diff.max()), float((diff / scale).max())


def node_times_from_trace(trace: Any, names: Sequence[str], *, skip: int = 0) -> dict[str, float]:
    """Median seconds per node from an onnxruntime profile, ignoring each node's first ``skip`` runs.

    Only ``names`` count: nodes inside If/Loop bodies are part of their parent's time.
    """
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    wanted = set(names)
    runs: dict[str, list[float]] = {}
    suffix = "_kernel_time"
    for event in events:
        if not isinstance(event, dict) or event.get("cat") != "Node":
            continue
        name = str(event.get("name", ""))
        node = name.removesuffix(suffix)
        if name.endswith(suffix) and node in wanted:
            runs.setdefault(node, []).append(float(event.get("dur", 0)) * 1e-6)
    return {node: float(np.median(t[min(skip, len(t) - 1) :])) for node, t in runs.items()}


def _input_shape(
    value: onnx.ValueInfoProto, batch_size: int, dims: Mapping[str, int]
) -> tuple[int, ...]:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise ModelInvalidError(
            f"graph input {value.name!r} has no shape; cannot generate values for it"
        )
    shape = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
        elif dim.dim_param in dims:
            shape.append(dims[dim.dim_param])
        elif axis == 0:
            shape.append(batch_size)
        else:
            label = repr(dim.dim_param) if dim.dim_param else "unnamed"
            raise ModelInvalidError(
                f"graph input {value.name!r}: dim {axis} ({label}) is symbolic",
                hint="give it a value in [plan.dims]",
            )
    return tuple(shape)


def _static_dims(value: onnx.ValueInfoProto | None) -> list[int]:
    if value is None or not value.type.tensor_type.HasField("shape"):
        return []
    return [
        d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim
    ]


def _describe(check: OutputCheck, options: OrtOptions) -> str:
    if check.problem:
        return f"output {check.name!r}: {check.problem}"
    if check.exact:
        return f"output {check.name!r} differs from the unsharded model (exact comparison, max abs error {check.max_abs:.3g})"
    return (
        f"output {check.name!r} differs from the unsharded model: max abs error {check.max_abs:.3g}, "
        f"max rel error {check.max_rel:.3g} (rtol {options.rtol:g}, atol {options.atol:g})"
    )


def _text(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:3])[:1000] or type(exc).__name__
