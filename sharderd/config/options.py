"""The effective options of one job's proving search, resolved once from flags, sidecar and config.

``[search]`` holds them for ``sharderd shard``; a daemon job takes the ``[daemon]`` keys that
repeat them (its pool, limits and default backend serve every job). The CLI and the daemon call
``search_options`` when they build a job; the job itself only reads the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sharderd.config.schema import Config

__all__ = ["SearchOptions", "amend_plan", "search_options"]


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """What one job proves with; every field is set (no defaults here: the config has them)."""

    backend: str
    """As requested (``auto`` included); ``resolve_backend`` picks the real one."""
    optimal_perf: bool
    max_attempts: int
    """Compiles at most, speculative ones included."""
    parallel: int
    """Attempts of this job at once."""
    attempt_timeout: float
    kill_grace: float
    auto_fallback: bool
    """``auto`` on an IPU target without poprt: verify with onnxruntime instead, with a warning
    (``sharderd shard``, the API), or refuse the job (the daemon, set up to compile)."""


def search_options(
    config: Config,
    *,
    daemon: bool = False,
    backend: str | None = None,
    optimal_perf: bool | None = None,
    max_attempts: int | None = None,
    parallel: int | None = None,
    attempt_timeout: float | None = None,
    kill_grace: float | None = None,
) -> SearchOptions:
    """Each argument given (a flag, a sidecar key) wins; else, with ``daemon``, the ``[daemon]``
    key (``backend``, ``max_attempts``, ``max_parallel_compiles``, ``attempt_timeout``,
    ``kill_grace``); else ``[search]``'s. ``None`` means not given. Only outside the daemon does
    ``auto`` fall back to onnxruntime when an IPU target has no poprt."""
    search = config.search
    options = SearchOptions(
        backend=search.backend,
        optimal_perf=search.optimal_perf,
        max_attempts=search.max_attempts,
        parallel=search.parallel,
        attempt_timeout=search.attempt_timeout,
        kill_grace=search.kill_grace,
        auto_fallback=not daemon,
    )
    if daemon:
        d = config.daemon
        options = replace(
            options,
            backend=d.backend,
            max_attempts=d.max_attempts,
            parallel=d.max_parallel_compiles,
            attempt_timeout=d.attempt_timeout,
            kill_grace=d.kill_grace,
        )
    given: dict[str, Any] = {
        "backend": backend,
        "optimal_perf": optimal_perf,
        "max_attempts": max_attempts,
        "parallel": parallel,
        "attempt_timeout": attempt_timeout,
        "kill_grace": kill_grace,
    }
    return replace(options, **{k: v for k, v in given.items() if v is not None})


def amend_plan(
    config: Config,
    *,
    batch_size: int | None = None,
    safety_margin: float | None = None,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    precision: Literal["model", "fp32", "fp16"] | None = None,
    name_nodes: bool = False,
    keep_dynamic: bool = False,
    no_serialize: bool = False,
) -> Config:
    """``config`` with its ``[plan]`` amended by a command's flags or an API call's arguments:
    each one given (not ``None``) wins; ``dims`` and ``input_shapes`` add to the config's, and the
    switches can only turn on (``no_serialize`` only off). ``PlanConfig`` validates the result;
    ``Config.plan_given`` gains each key given."""
    plan = config.plan
    given: dict[str, Any] = {
        "batch_size": batch_size,
        "safety_margin": safety_margin,
        "precision": precision,
    }
    plan = replace(plan, **{k: v for k, v in given.items() if v is not None})
    switches = {
        "dims": bool(dims),
        "input_shapes": bool(input_shapes),
        "name_nodes": name_nodes,
        "keep_dynamic": keep_dynamic,
        "serialize": no_serialize,
    }
    named = {k for k, v in given.items() if v is not None} | {k for k, on in switches.items() if on}
    if dims:
        plan = replace(plan, dims={**plan.dims, **dims})
    if input_shapes:
        shapes = {name: tuple(shape) for name, shape in input_shapes.items()}
        plan = replace(plan, input_shapes={**plan.input_shapes, **shapes})
    if name_nodes:
        plan = replace(plan, name_nodes=True)
    if keep_dynamic:
        plan = replace(plan, keep_dynamic=True)
    if no_serialize:
        plan = replace(plan, serialize=False)
    return replace(config, plan=plan, plan_given=config.plan_given | named)
