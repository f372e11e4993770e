"""Check the stages' outputs against the unsharded model run on the same inputs.

Integers, bools and strings must be equal; floats within ``rtol``/``atol``. The reference is the
user's input file (the prover always passes it), run on the same inputs at the same shapes, so a
fault in annotating or writing the sharded model fails here. Any annotations it carries are
stripped first: onnxruntime's fusions copy them onto fused nodes and then refuse the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sharderd.backends.ort_failure import AttemptFailure, error_text
from sharderd.backends.ort_options import OrtOptions
from sharderd.backends.ort_sessions import OrtSession, session_options
from sharderd.graph.weights import read_model_proto
from sharderd.shard.split import strip_annotations

__all__ = [
    "OutputCheck",
    "compare_outputs",
    "describe_failures",
    "reference_outputs",
    "verification_details",
]


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


def reference_outputs(
    ort: Any, path: Path, feeds: Mapping[str, Any], options: OrtOptions
) -> dict[str, Any]:
    """The unsharded model's outputs; its session is gone when this returns."""
    model = read_model_proto(path)
    strip_annotations(model.graph)
    so = session_options(ort, optimization=options.graph_optimization)
    try:
        session = OrtSession.build(ort, model, path.parent, so, list(options.reference_providers))
        inputs = [i.name for i in session.session.get_inputs()]
        missing = [name for name in inputs if name not in feeds]
        if missing:
            raise AttemptFailure(
                "invalid",
                f"verification failed: the input model {path.name} has inputs the sharded model does not have: {missing}",
                cause="verification",
            )
        for arg in session.session.get_inputs():
            feed = np.shape(feeds[arg.name])
            declared = list(arg.shape)
            fixed = [(k, d) for k, d in enumerate(declared) if isinstance(d, int) and d > 0]
            if len(declared) != len(feed) or any(feed[k] != d for k, d in fixed):
                raise AttemptFailure(
                    "invalid",
                    f"verification failed: input {arg.name!r} is {list(feed)} in the sharded model "
                    f"but {declared} in the input model {path.name}",
                    cause="verification",
                )
        names = [o.name for o in session.session.get_outputs()]
        values = session.run(names, {name: feeds[name] for name in inputs})
    except AttemptFailure:
        raise
    except Exception as exc:
        raise AttemptFailure(
            "invalid",
            f"the unsharded model {path.name} does not run in onnxruntime: {error_text(exc)}",
        ) from None
    return dict(zip(names, values, strict=True))


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
            diff = (out != ref).astype(np.float64)
            checks.append(OutputCheck(name, not diff.any(), *_maxima(diff, 1.0), exact))
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


def verification_details(
    checks: Sequence[OutputCheck], options: OrtOptions, reference: Path
) -> dict[str, Any]:
    """The report's ``verification`` block; ``reference_model`` is the file the stages were checked
    against (the user's own, also when the planned graph is a serialized copy)."""
    return {
        "passed": all(c.passed for c in checks),
        "reference_model": str(reference),
        "rtol": options.rtol,
        "atol": options.atol,
        "outputs": {c.name: asdict(c) for c in checks},
    }


def describe_failures(checks: Sequence[OutputCheck], options: OrtOptions) -> str:
    """One message naming every failed output, or "" when all passed."""
    failed = [c for c in checks if not c.passed]
    if not failed:
        return ""
    return "verification failed: " + "; ".join(_describe(c, options) for c in failed)


def _maxima(diff: np.ndarray, scale: np.ndarray | float) -> tuple[float, float]:
    if not diff.size:
        return 0.0, 0.0
    return float(diff.max()), float((diff / scale).max())


def _describe(check: OutputCheck, options: OrtOptions) -> str:
    if check.problem:
        return f"output {check.name!r}: {check.problem}"
    if check.exact:
        return f"output {check.name!r} differs from the unsharded model (exact comparison, max abs error {check.max_abs:.3g})"
    return (
        f"output {check.name!r} differs from the unsharded model: max abs error {check.max_abs:.3g}, "
        f"max rel error {check.max_rel:.3g} (rtol {options.rtol:g}, atol {options.atol:g})"
    )
