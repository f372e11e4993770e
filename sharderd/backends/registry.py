"""Which backend proves a plan, and the options its attempt subprocess gets.

Availability is checked without importing the backend (importing poprt loads Poplar).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sharderd.config import Config
from sharderd.errors import BackendUnavailableError, ConfigError
from sharderd.target import Target

__all__ = ["BACKENDS", "attempt_options", "is_available", "resolve_backend"]

BACKENDS = ("poprt", "onnxruntime", "none")

_INSTALL_HINT = {
    "poprt": "poprt is not installed: install the Poplar SDK or use --backend onnxruntime",
    "onnxruntime": "onnxruntime is not installed: `python3 -m pip install onnxruntime`, or use --backend none",
}


def is_available(name: str) -> bool:
    if name == "none":
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_backend(name: str, target: Target) -> str:
    """``auto``: poprt for an IPU target when it imports, else onnxruntime, else none."""
    if name == "auto":
        if target.kind == "ipu" and is_available("poprt"):
            return "poprt"
        return "onnxruntime" if is_available("onnxruntime") else "none"
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose auto, {', '.join(BACKENDS)}")
    if not is_available(name):
        raise BackendUnavailableError(_INSTALL_HINT[name])
    return name


def attempt_options(
    backend: str,
    config: Config,
    *,
    amp: float | None = None,
    profile: bool = False,
    stages_dir: str | None = None,
    reference_model: Path | None = None,
    precision: str = "fp32",
    input_shapes: Mapping[str, list[int]] | None = None,
) -> dict[str, Any]:
    """The ``AttemptRequest.options`` for one attempt.

    onnxruntime checks the stages against ``reference_model``, the user's own file (never the
    written model, so a fault in annotating or writing fails the check), at the planned shapes and
    with the tolerances of the planned precision.
    """
    if backend == "poprt":
        options = asdict(config.poprt)
        if amp is not None:
            options["available_memory_proportion"] = amp
        return options
    if backend == "onnxruntime":
        ort = config.onnxruntime
        half = precision == "fp16"
        return {
            "providers": list(ort.providers),
            "rtol": ort.fp16_rtol if half else ort.rtol,
            "atol": ort.fp16_atol if half else ort.atol,
            "warmup": ort.warmup,
            "runs": ort.runs,
            "low_memory": ort.low_memory,
            "seed": ort.seed,
            "verify": True,
            "measure": True,
            "profile": profile,
            "dims": dict(config.plan.dims),
            **({"input_shapes": {k: list(v) for k, v in input_shapes.items()}} if input_shapes else {}),
            **({"reference_model": str(reference_model)} if reference_model else {}),
            **({"write_stages_dir": stages_dir} if ort.write_stages and stages_dir else {}),
        }
    return {}
