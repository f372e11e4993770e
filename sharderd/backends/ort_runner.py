"""Build, run and time stage sessions with the attempt's providers, one device per stage.

Every onnxruntime error here becomes a verdict: an allocation failure under a memory cap is
``oom`` on the stage's device (the search loop moves work off it), anything else ``invalid``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sharderd.backends.ort_failure import AttemptFailure, error_text
from sharderd.backends.ort_options import OrtOptions
from sharderd.backends.ort_pipeline import time_calls
from sharderd.backends.ort_sessions import OrtSession, session_options
from sharderd.backends.protocol import OomInfo
from sharderd.shard.split import StageModel

__all__ = ["StageRunner"]

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
_SAVED_EXTERNAL = "session.optimized_model_external_initializers_file_name"
_SAVED_EXTERNAL_MIN = "session.optimized_model_external_initializers_min_size_in_bytes"


class StageRunner:
    """Sessions for the stages of one attempt; ``threads`` intra-op threads each."""

    __slots__ = ("options", "ort", "threads")

    def __init__(self, ort: Any, options: OrtOptions, n_stages: int) -> None:
        self.ort = ort
        self.options = options
        self.threads = options.intra_op_threads or max(1, (os.cpu_count() or 1) // n_stages)
        here = set(ort.get_available_providers())
        missing = [p for p in (*options.providers, *options.reference_providers) if p not in here]
        if missing:
            raise AttemptFailure(
                "invalid",
                f"execution provider(s) {missing} are not available here (available: {sorted(here)})",
            )

    def create(
        self,
        stage: StageModel,
        *,
        optimization: str | None = None,
        profile_prefix: Path | None = None,
        save_optimized: Path | None = None,
    ) -> OrtSession:
        """A session for ``stage`` on device ``stage.index``.

        ``optimization`` defaults to the attempt's level; ``profile_prefix`` turns the profiler
        on; ``save_optimized`` writes the graph onnxruntime executes there (weights beside it in
        a data file, so a large stage costs a file, not a 2 GB protobuf).
        """
        i = stage.index
        so = session_options(
            self.ort,
            optimization=optimization or self.options.graph_optimization,
            threads=self.threads,
        )
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(profile_prefix)
        if save_optimized is not None:
            so.optimized_model_filepath = str(save_optimized)
            so.add_session_config_entry(_SAVED_EXTERNAL, f"{save_optimized.name}.data")
            so.add_session_config_entry(_SAVED_EXTERNAL_MIN, "1024")
        providers = list(self.options.providers)
        try:
            session = OrtSession.build(
                self.ort,
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
            raise AttemptFailure(
                "invalid",
                f"stage {i}: onnxruntime could not use {fallback} on device {i} (it fell back to {used})",
            )
        return session

    def run(self, session: OrtSession, stage: StageModel, env: Mapping[str, Any]) -> dict[str, Any]:
        """The stage's outputs, reading its inputs from ``env`` (every tensor known so far)."""
        try:
            values = session.run(list(stage.outputs), {name: env[name] for name in stage.inputs})
        except Exception as exc:
            raise self._failure(exc, stage.index, "run") from None
        return dict(zip(stage.outputs, values, strict=True))

    def time_stage(
        self, session: OrtSession, stage: StageModel, env: Mapping[str, Any]
    ) -> np.ndarray | None:
        """Seconds per run of one stage on its real inputs; None unless measuring."""
        if not self.options.measure:
            return None
        outputs, feed = list(stage.outputs), {name: env[name] for name in stage.inputs}
        return time_calls(
            lambda: session.run(outputs, feed), warmup=self.options.warmup, runs=self.options.runs
        )

    def _provider_options(self, provider: str, device: int) -> dict[str, str]:
        if provider not in _DEVICE_PROVIDERS:
            return {}
        values = {"device_id": str(device)}
        if provider in _MEMORY_LIMITED and self.options.gpu_mem_limit is not None:
            values["gpu_mem_limit"] = str(self.options.gpu_mem_limit)
        return values

    def _failure(self, exc: Exception, stage: int, doing: str) -> AttemptFailure:
        """An allocation failure under a memory cap is ``oom`` on the stage's device.

        onnxruntime names no tile and no byte count that fits ``OomInfo``, so the kind is
        ``variables``, the numberless out-of-memory form: the search loop moves work off the
        device without a number to size the move.
        """
        text = error_text(exc)
        limit = self.options.gpu_mem_limit
        if limit is not None and _ALLOCATION_FAILED.search(text):
            return AttemptFailure(
                "oom",
                f"stage {stage} does not fit on device {stage} (gpu_mem_limit {limit} bytes): {text}",
                OomInfo("variables", device=stage),
            )
        return AttemptFailure("invalid", f"stage {stage}: onnxruntime cannot {doing} it: {text}")
