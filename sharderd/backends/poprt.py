"""The poprt backend, child side: compile an annotated model with PopRT and optionally time it.

``poprt`` ships only with the Poplar SDK, so it is imported inside ``run_attempt``, which runs
in the attempt subprocess; the parent only asks ``available()``. A compile failure is data, not
an exception: PopRT's ``RuntimeError`` text goes through ``parse_compile_error``.
``POPLAR_ENGINE_OPTIONS`` is removed first: profiling options in it switch Poplar to the
numberless out-of-memory text (no tile, so no device to move work off) and slow compiles down.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from sharderd.backends.poprt_errors import parse_compile_error
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest, BenchmarkResult
from sharderd.backends.registry import is_available
from sharderd.shard.amp import stage_amps_of
from sharderd.shard.annotate import IPU_ATTR, STAGE_ATTR
from sharderd.target import MK2_TILES

__all__ = ["NOT_INSTALLED", "available", "run_attempt"]

NOT_INSTALLED = "poprt is not installed: install the Poplar SDK or use --backend onnxruntime"


def available() -> bool:
    """Whether ``poprt`` could be imported here, without importing it (that loads Poplar)."""
    return is_available("poprt")


def run_attempt(request: AttemptRequest) -> AttemptOutcome:
    """Compile ``request.model`` to ``request.artifact``; benchmark it when asked."""
    try:
        import poprt  # noqa: F401 - the SDK's presence is the question
        from poprt import compiler, runtime
    except ImportError:
        return AttemptOutcome("invalid", message=NOT_INSTALLED)
    if request.benchmark_only:
        return _run_compiled(request, runtime)

    notes: list[str] = []
    if os.environ.pop("POPLAR_ENGINE_OPTIONS", None) is not None:
        notes.append(
            "note: POPLAR_ENGINE_OPTIONS was unset for this compile (profiling options hide which tile runs out of memory)"
        )
    try:
        compile_path, changes = _convert(request)
    except RuntimeError as exc:
        return AttemptOutcome("invalid", message=_join(f"PopRT's conversion failed: {exc}", notes))
    notes.append(f"note: converted as PopRT does ({changes})")
    graph = onnx.load(compile_path, load_external_data=False).graph
    # What the compiled model itself carries, read back from it: a probe's overflow proves
    # nothing for a serialization the conversion lost (plan.probe.why_no_proof).
    from sharderd.shard.matmul_serial import node_serialization

    details = {"matmul_serialization": node_serialization(graph)}
    outputs = [value.name for value in graph.output]
    n_stages = _stage_count(graph, request.num_devices)

    options = compiler.CompilerOptions()
    summary = _configure(options, request, n_stages, graph, notes)
    try:
        options.ipu_version = (
            str(request.options.get("ipu_version") or "")
            or runtime.DeviceManager().ipu_hardware_version()
        )
    except RuntimeError as exc:
        return AttemptOutcome(
            "invalid",
            message=_join(f"cannot detect the IPU version (set poprt.ipu_version): {exc}", notes),
        )

    try:
        compiler.Compiler.compile_and_export(compile_path, outputs, request.artifact, options)
    except RuntimeError as exc:
        tiles = request.tiles_per_device or MK2_TILES
        outcome, oom, message = parse_compile_error(str(exc), tiles)
        return AttemptOutcome(outcome, message=_join(message, notes), oom=oom, details=details)

    message = f"compiled for {request.num_devices} × {options.ipu_version} ({summary})"
    benchmark = None
    if request.benchmark:
        try:
            # enough batches in flight to fill every stage twice over, at least one step's worth
            depth = max(options.batches_per_step, 2 * n_stages)
            benchmark = _benchmark(runtime.Runner(request.artifact), request, depth)
        except RuntimeError as exc:
            notes.append(f"note: the benchmark failed, the compile stands: {exc}")
    return AttemptOutcome(
        "ok",
        message=_join(message, notes),
        artifact=request.artifact,
        benchmark=benchmark,
        ipus_on_host=_ipus_on_host(runtime),
        details=details,
    )


def _ipus_on_host(runtime: Any) -> int | None:
    try:
        return int(runtime.DeviceManager().get_num_devices())
    except RuntimeError:
        return None


def _run_compiled(request: AttemptRequest, runtime: Any) -> AttemptOutcome:
    """The benchmark step: attach to the IPUs and time ``request.artifact``, compiled earlier."""
    graph = onnx.load(request.model, load_external_data=False).graph
    n_stages = _stage_count(graph, request.num_devices)
    wanted = int(request.options.get("batches_per_step", 0)) or request.num_devices
    depth = max(wanted, 2 * n_stages)  # as the compile step sets batches_per_step
    try:
        benchmark = _benchmark(runtime.Runner(request.artifact), request, depth)
    except RuntimeError as exc:
        return AttemptOutcome("invalid", message=f"the benchmark failed: {exc}")
    return AttemptOutcome(
        "ok", message=f"benchmarked on {request.num_devices} IPUs", benchmark=benchmark
    )


def _convert(request: AttemptRequest) -> tuple[str, str]:
    """PopRT's own flow before a compile: ``Converter(precision=...).convert`` and the
    ``int64_to_int32`` pass, then the plan, any per-op ``__available_memory`` and any
    ``__serialize_matmul_mode``/``__serialize_matmul_factor`` put back by node name (PopRT applies
    manual sharding after conversion; a rebuilt graph loses the attributes). Writes
    ``<artifact>.converted.onnx``; returns its path and what changed."""
    import poprt
    from poprt.converter import Converter

    from sharderd.graph.weights import read_model_proto, with_inlined
    from sharderd.shard.amp import node_amps
    from sharderd.shard.matmul_serial import node_serialization, set_serialization
    from sharderd.shard.reannotate import reapply_annotation
    from sharderd.shard.write import write_converted

    # With its weights (conversion rewrites them), read by our reader: onnx's refuses the hard
    # links through which an attempt folder shares the job's data.
    source = Path(request.model)
    model = with_inlined(read_model_proto(source), source.parent)
    planned = {
        node.name: {a.name: a.i for a in node.attribute if a.name in (IPU_ATTR, STAGE_ATTR)}
        for node in model.graph.node
        if any(a.name in (IPU_ATTR, STAGE_ATTR) for a in node.attribute)
    }
    amps = node_amps(model.graph)
    serial = node_serialization(model.graph)
    converted = Converter(convert_version=11, precision=request.precision).convert(model)
    converted = poprt.Pass.get_pass("int64_to_int32")(converted)
    original = {node.name for node in model.graph.node}
    changes = reapply_annotation(converted, planned, original, amps)
    set_serialization(converted, serial)
    path = f"{request.artifact}.converted.onnx"
    write_converted(converted, Path(path))
    text = changes.describe(request.precision)
    if serial:
        text += "; matmul serialization: " + ", ".join(
            f"{n} ×{k}" for n, k in sorted(serial.items())
        )
    return path, text


def _configure(
    options: Any, request: AttemptRequest, n_stages: int, graph: onnx.GraphProto, notes: list[str]
) -> str:
    """Set CompilerOptions from the request; returns a short description for the message."""
    opts: Mapping[str, Any] = request.options
    options.num_ipus = request.num_devices
    annotated = any(a.name == IPU_ATTR for node in graph.node for a in node.attribute)
    # One device without annotations compiles as a plain single-IPU model.
    options.virtual_graph_mode = "manual" if annotated or request.num_devices > 1 else "off"
    options.available_memory_proportion = float(opts.get("available_memory_proportion", 0.6))
    options.partials_type = str(opts.get("partials_type", "half"))
    options.num_io_tiles = int(opts.get("num_io_tiles", 0))
    pipelining = bool(opts.get("enable_pipelining", True))
    if pipelining and request.num_devices < 2:
        pipelining = False
        notes.append("note: pipelining is off on a single IPU (PopART requires more than one)")
    options.enable_pipelining = pipelining
    per_stage = stage_amps_of(graph)
    if per_stage:
        notes.append(
            "note: __available_memory on the conv/matmul nodes of "
            + ", ".join(f"stage {s}: {a:g}" for s, a in sorted(per_stage.items()))
        )
    if not pipelining:
        return f"amp {options.available_memory_proportion}, no pipelining"
    wanted = int(opts.get("batches_per_step", 0)) or request.num_devices
    if wanted < n_stages:
        notes.append(
            f"note: batches_per_step raised from {wanted} to {n_stages}, the number of pipeline stages"
        )
    options.batches_per_step = max(wanted, n_stages)
    return (
        f"amp {options.available_memory_proportion}, {n_stages} pipeline stages, "
        f"batches_per_step {options.batches_per_step}"
    )


def _stage_count(graph: onnx.GraphProto, num_devices: int) -> int:
    """Stages as PopART counts them: ``__pipeline_stage`` values, else one per IPU."""
    stages = {
        int(onnx.helper.get_attribute_value(a))
        for node in graph.node
        for a in node.attribute
        if a.name == STAGE_ATTR
    }
    return len(stages) if stages else num_devices


def _benchmark(runner: Any, request: AttemptRequest, in_flight: int) -> BenchmarkResult:
    """Latency: batches one at a time, each waited for. Throughput: ``in_flight`` batches queued
    with ``execute_async`` (each with its own output buffers), as PopRT's runtime is meant to be
    fed, so every stage has work: a pipeline's rate, not the sum of its stages."""
    rng = np.random.default_rng(0)
    inputs = {
        desc.name: _sample(rng, desc.shape, np.dtype(desc.numpy_data_type()))
        for desc in runner.get_execute_inputs()
    }
    slots = [
        {
            desc.name: np.zeros(desc.shape, dtype=np.dtype(desc.numpy_data_type()))
            for desc in runner.get_execute_outputs()
        }
        for _ in range(max(in_flight, 1))
    ]
    for _ in range(request.warmup):
        runner.execute_async(inputs, slots[0]).wait()
    times = np.empty(max(request.runs, 1))
    for i in range(len(times)):
        start = time.perf_counter()
        runner.execute_async(inputs, slots[0]).wait()
        times[i] = time.perf_counter() - start
    latency = float(np.median(times))
    q1, q3 = np.percentile(times, [25, 75])

    queued: deque[Any] = deque()
    start = time.perf_counter()
    for i in range(len(times)):
        if len(queued) == len(slots):
            queued.popleft().wait()  # its slot's outputs are free again
        queued.append(runner.execute_async(inputs, slots[i % len(slots)]))
    while queued:
        queued.popleft().wait()
    elapsed = time.perf_counter() - start
    return BenchmarkResult(
        latency_s=latency,
        throughput_per_s=request.batch_size * len(times) / elapsed if elapsed > 0 else 0.0,
        runs=len(times),
        spread_s=float(q3 - q1),
        in_flight=len(slots),
    )


def _sample(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    """Random floats; zeros for integers and booleans, which are often indices or masks."""
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _join(message: str, notes: list[str]) -> str:
    return "\n".join([message, *notes])
