"""The onnxruntime backend, child side: split, build, verify and time the stages of a plan.

"Compiling" a plan is building one ``InferenceSession`` per stage (stage i on device i when the
provider has devices). Every stage then runs once on generated inputs, so a stage that cannot
allocate its activations fails here, not in production. Verification compares every graph
output with the unsharded model run on the same inputs; a difference is an ``invalid``
outcome naming the output, never a silent pass. Measuring times each stage and the stages as a
concurrent pipeline; profiling times every node, at the optimization level that is measured,
so the planner can re-plan with measured costs.

No session ever loads the annotated file as written: stages are split out without the
``__ipu_number``/``__pipeline_stage`` attributes, and the reference drops them, because
onnxruntime's fusions copy them onto fused nodes and then refuse the model.

Memory: by default all stage sessions exist at once (built before anything runs, so a build
failure costs nothing). With ``low_memory`` the reference session is released before the first
stage session is built and each stage session before the next, so the peak is one of them,
never the whole model twice; the concurrent pipeline is then estimated from the stage times.

``onnxruntime`` is imported inside ``run_attempt`` only: the parent asks ``available()``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from sharderd.backends.ort_failure import AttemptFailure
from sharderd.backends.ort_inputs import index_bounds, make_inputs
from sharderd.backends.ort_measure import stage_benchmark
from sharderd.backends.ort_options import OrtOptions
from sharderd.backends.ort_profile import StageProfile, node_times_from_trace, profile_stage
from sharderd.backends.ort_runner import StageRunner
from sharderd.backends.ort_verify import (
    OutputCheck,
    compare_outputs,
    describe_failures,
    reference_outputs,
    verification_details,
)
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import is_available
from sharderd.errors import SharderdError
from sharderd.graph.in_file import claim_links, drop_links, linked
from sharderd.graph.weights import read_model_proto
from sharderd.shard.split import StageModel, split_stages, write_stages

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
    "onnxruntime is not installed: `python3 -m pip install onnxruntime` (or onnxruntime-gpu)"
)


def available() -> bool:
    """Whether onnxruntime could be imported here, without importing it."""
    return is_available("onnxruntime")


def run_attempt(request: AttemptRequest) -> AttemptOutcome:
    """Split ``request.model``, build a session per stage, run, verify, measure and profile as asked."""
    try:
        import onnxruntime
    except ImportError:
        return AttemptOutcome("invalid", message=NOT_INSTALLED, cause="setup")
    details: dict[str, Any] = {}
    try:
        options = OrtOptions.from_request(request)
        return _attempt(onnxruntime, request, options, details)
    except AttemptFailure as failure:
        return AttemptOutcome(
            failure.outcome,
            message=failure.message,
            oom=failure.oom,
            details=details,
            cause=failure.cause or ("compiler" if failure.outcome == "invalid" else None),
        )
    except SharderdError as err:
        return AttemptOutcome("invalid", message=str(err), details=details, cause="setup")


def _attempt(
    ort: Any, request: AttemptRequest, options: OrtOptions, details: dict[str, Any]
) -> AttemptOutcome:
    model_path = Path(request.model)
    model = read_model_proto(model_path)
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
        raise AttemptFailure(
            "invalid",
            f"the model has {len(stages)} pipeline stages but the attempt has {request.num_devices} device(s)",
        )
    artifact = None
    if options.write_stages_dir:
        stem = model_path.name.removesuffix(".onnx").removesuffix(".sharded")
        written = _inline(stages, linked(model))
        paths = write_stages(written, Path(options.write_stages_dir), stem=stem)
        details["stage_files"] = [str(p) for p in paths]
        artifact = options.write_stages_dir
    runner = StageRunner(ort, options, len(stages))
    details.update(
        providers=list(options.providers),
        threads_per_stage=runner.threads,
        graph_optimization=options.graph_optimization,
        low_memory=options.low_memory,
    )

    sessions = [] if options.low_memory else [runner.create(s) for s in stages]
    feeds = make_inputs(
        model,
        batch_size=options.batch_size,
        dims=options.dims,
        seed=options.seed,
        input_shapes=options.input_shapes,
    )
    details["inputs"] = {
        name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in feeds.items()
    }
    reference = None
    reference_path = Path(options.reference_model) if options.reference_model else model_path
    if options.verify:
        reference = reference_outputs(ort, reference_path, feeds, options)

    env: dict[str, Any] = dict(feeds)
    times: list[np.ndarray | None] = []
    profiles: list[StageProfile] = []
    for stage in stages:
        session = sessions[stage.index] if sessions else runner.create(stage)
        env.update(runner.run(session, stage, env))
        if options.low_memory:
            times.append(runner.time_stage(session, stage, env))
        del session  # with low_memory: released before any other session is built
        if options.low_memory and options.profile:
            profiles.append(profile_stage(runner, stage, env))

    message = f"{len(stages)} stage session(s) built with {', '.join(options.providers)}"
    if reference is not None:
        checks = compare_outputs(reference, env, rtol=options.rtol, atol=options.atol)
        details["verification"] = verification_details(checks, options, reference_path)
        failed = describe_failures(checks, options)
        if failed:
            raise AttemptFailure("invalid", failed, cause="verification")
        worst = max((c.max_abs for c in checks), default=0.0)
        message += f"; verified {len(checks)} output(s), max abs error {worst:.2g}"

    if not options.low_memory:
        for stage, session in zip(stages, sessions, strict=True):
            times.append(runner.time_stage(session, stage, env))
            if options.profile:
                profiles.append(profile_stage(runner, stage, env))
    if options.profile and options.measure and options.profile_scale:
        medians = [float(np.median(t)) for t in times if t is not None]
        profiles = [p.scaled_to(m) for p, m in zip(profiles, medians, strict=True)]
    if options.profile:
        details["node_times_s"] = {k: v for p in profiles for k, v in p.node_times_s.items()}
        details["profile"] = {
            "optimization": options.profile_level,
            "stages": [p.summary() for p in profiles],
        }
    benchmark = None
    if options.measure:
        measured = [t for t in times if t is not None]
        benchmark = stage_benchmark(stages, sessions, measured, feeds, options, details)
        message += (
            f"; {benchmark.throughput_per_s:.4g} samples/s, stage medians "
            + ", ".join(f"{t * 1e3:.3g}" for t in benchmark.stage_times_s)
            + " ms"
        )
    return AttemptOutcome(
        "ok", message=message, artifact=artifact, benchmark=benchmark, details=details
    )


def _inline(stages: list[StageModel], links: dict[str, list[int]]) -> list[StageModel]:
    """Stages to write, the weights they read through ``links`` (inline in a model file: the user's,
    or the attempt's own) held inline again, as the stages of an inline model were."""
    written = []
    for stage in stages:
        model = onnx.ModelProto()
        model.CopyFrom(stage.model)
        drop_links(model)
        claim_links(model, stage.base_dir, links)
        written.append(replace(stage, model=model))
    return written
