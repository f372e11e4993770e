"""Which backend proves a plan: one registry, the ``Backend`` protocol, and the attempt options.

A backend is anything with ``available()`` and ``run_attempt(request)`` (the shipped ones are the
modules ``sharderd.backends.poprt`` and ``sharderd.backends.onnxruntime``). Importing a backend
module never imports its SDK (importing poprt loads Poplar): ``available()`` asks without
importing, and ``run_attempt`` imports the SDK inside the attempt subprocess
(``python -m sharderd.backends.worker``), which finds the backend here by the request's name.

``none`` is a choice, not a backend: it plans only, so it has no attempt and no entry.

Extra backends (tests register the ``fault`` backend this way) reach the worker through the
environment, since it is a subprocess: :data:`EXTRA_BACKENDS_ENV` holds comma-separated
``NAME=MODULE[:ATTR]`` entries, imported only when a request names them. They are worker-only:
``--backend`` and ``search.backend`` still offer the shipped choices alone.

Where attempts run elsewhere (``[cluster] engine = "ray"``), the runner answers for its hosts
(:class:`AttemptHosts`): ``poprt`` is then available when some live node offers the SDK resource,
whatever this interpreter can import.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from sharderd.backends.poplar_sdk import poprt_missing_hint
from sharderd.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:
    from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
    from sharderd.config import Config
    from sharderd.target import Target

__all__ = [
    "BACKENDS",
    "EXTRA_BACKENDS_ENV",
    "PROVEN_STATUS",
    "SHIPPED",
    "AttemptHosts",
    "Backend",
    "attempt_options",
    "fallback_warnings",
    "is_available",
    "load_backend",
    "registered",
    "resolve_backend",
]


@runtime_checkable
class Backend(Protocol):
    """Proves one plan in the attempt subprocess; a module with these two functions is one."""

    def available(self) -> bool:
        """Whether it could run here, answered without importing its SDK."""
        ...

    def run_attempt(self, request: AttemptRequest) -> AttemptOutcome:
        """Compile or run ``request`` and say how it went; a compiler verdict is data."""
        ...


@runtime_checkable
class AttemptHosts(Protocol):
    """The hosts where attempts run, when they are not this one (the Ray runner)."""

    async def refresh(self) -> None:
        """Look at the hosts now, for :meth:`offers` (may wait for them: a cluster's lost head)."""
        ...

    def offers(self, backend: str) -> bool | None:
        """True: some host can run ``backend`` now; False: none can yet, an attempt waits for one
        (and fails naming what it waits for); None: the hosts cannot tell, ask this interpreter."""
        ...


SHIPPED: Final[Mapping[str, str]] = {
    "poprt": "sharderd.backends.poprt",
    "onnxruntime": "sharderd.backends.onnxruntime",
}
"""Every shipped backend by name, as ``MODULE[:ATTR]``."""
BACKENDS: Final = (*SHIPPED, "none")
"""The choices ``--backend`` and ``search.backend`` offer besides ``auto``."""
PROVEN_STATUS: Final[Mapping[str, str]] = {
    "poprt": "compiled",
    "onnxruntime": "verified",
    "none": "not_compiled",
}
"""The ``status`` of a job that succeeded, by the backend that ran (report.json, the Python
result, the ``job.succeeded`` log line, the daemon's status and metrics): PopRT ``compiled`` the
sharded model; onnxruntime ran its stages and ``verified`` their outputs against the user's model,
compiling nothing; with ``none`` it was planned and written, ``not_compiled``."""
EXTRA_BACKENDS_ENV: Final = "SHARDERD_EXTRA_BACKENDS"
"""Comma-separated ``NAME=MODULE[:ATTR]`` backends added to :data:`SHIPPED` (tests use it)."""

_INSTALL_HINT = {
    "poprt": "poprt is not installed: install the Poplar SDK or use --backend onnxruntime",
    "onnxruntime": "onnxruntime is not installed: `python3 -m pip install onnxruntime`, or use --backend none",
}


def registered(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every backend a worker can run: the shipped ones plus :data:`EXTRA_BACKENDS_ENV`'s."""
    extra = (os.environ if environ is None else environ).get(EXTRA_BACKENDS_ENV, "")
    backends = dict(SHIPPED)
    for entry in filter(None, (part.strip() for part in extra.split(","))):
        name, sep, target = entry.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise ConfigError(f"{EXTRA_BACKENDS_ENV}: {entry!r} is not NAME=MODULE[:ATTR]")
        backends[name.strip()] = target.strip()
    return backends


def load_backend(name: str, environ: Mapping[str, str] | None = None) -> Backend:
    """Import the backend registered as ``name``; ``KeyError`` when there is none."""
    module_name, _, attr = registered(environ)[name].partition(":")
    backend: Any = importlib.import_module(module_name)
    if attr:
        backend = getattr(backend, attr)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend {name!r} ({registered(environ)[name]}) is not a Backend")
    return backend


def is_available(name: str) -> bool:
    """Whether the package ``name`` could be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_backend(
    name: str, target: Target, hosts: AttemptHosts | None = None, *, fallback: bool = True
) -> str:
    """``auto``: poprt for an IPU target when it is offered, else onnxruntime, else none; without
    ``fallback`` (the daemon) an IPU target without poprt is ``BackendUnavailableError`` instead,
    as onnxruntime would compile nothing.

    Offered means: where the attempts run (``hosts``, a cluster) when they can tell, else
    importable here. A backend the cluster lacks now but may gain is chosen when named (its
    attempt waits for a node); ``auto`` takes only what is there.
    """

    def answer(backend: str) -> bool | None:
        return None if hosts is None else hosts.offers(backend)

    def offered(backend: str) -> bool:
        said = answer(backend)
        return load_backend(backend).available() if said is None else said

    if name == "auto":
        if target.kind == "ipu" and offered("poprt"):
            return "poprt"
        if target.kind == "ipu" and not fallback:
            raise BackendUnavailableError(
                f"backend auto with the IPU target {target.name} needs PopRT, but poprt does not "
                "import here: the job would be verified with onnxruntime and nothing compiled",
                hint=poprt_missing_hint(),
            )
        return "onnxruntime" if offered("onnxruntime") else "none"
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose auto, {', '.join(BACKENDS)}")
    if name != "none" and answer(name) is None and not load_backend(name).available():
        other = "onnxruntime" if name == "poprt" else "none"
        raise BackendUnavailableError(_INSTALL_HINT[name], reruns=({"backend": other},))
    return name


def fallback_warnings(requested: str, backend: str, target: Target) -> list[str]:
    """The report's warning when ``auto`` on an IPU target proved with something else than PopRT."""
    if requested != "auto" or target.kind != "ipu" or backend == "poprt":
        return []
    what = (
        "onnxruntime verified the plan on the CPU"
        if backend == "onnxruntime"
        else "nothing proved the plan"
    )
    return [
        f"backend auto: poprt does not import here, so {what} instead of PopRT compiling it for "
        f"{target.name} (nothing was compiled); enable the Poplar SDK to compile (docs/ipu-host.md), "
        f"or ask for backend {backend} to do this on purpose"
    ]


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
            **(
                {"input_shapes": {k: list(v) for k, v in input_shapes.items()}}
                if input_shapes
                else {}
            ),
            # absolute: the attempt runs in its own folder, not the user's working directory
            **(
                {"reference_model": str(Path(reference_model).resolve())} if reference_model else {}
            ),
            **({"write_stages_dir": stages_dir} if ort.write_stages and stages_dir else {}),
        }
    return {}
