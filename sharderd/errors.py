"""Errors by cause, each carrying a user-facing message and the CLI exit code.

The engine raises these; the CLI prints ``str(err)`` and exits with ``err.exit_code``; the daemon
files them under ``failed/`` with ``err.reason``. Nothing here formats tracebacks: a
``SharderdError`` is an expected outcome, anything else is a bug.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import ClassVar

from sharderd.fsutil import os_error_advice

__all__ = [
    "EXIT_BACKEND_UNAVAILABLE",
    "EXIT_BAD_INPUT",
    "EXIT_DOES_NOT_FIT",
    "EXIT_FAILED",
    "EXIT_NOT_PROVEN",
    "EXIT_OK",
    "GROUNDS",
    "BackendUnavailableError",
    "BadJobError",
    "CompileFailedError",
    "ConfigError",
    "DimsUnresolvedError",
    "InternalError",
    "JobCancelledError",
    "ModelInvalidError",
    "NoSplitError",
    "NotProvenError",
    "OutputWriteError",
    "PlanInfeasibleError",
    "PlanningLimitError",
    "SharderdError",
    "StorageError",
    "VerificationError",
    "WorkerCrashedError",
    "WorkerDiedError",
    "os_error_advice",
    "sole_exception",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3
EXIT_BACKEND_UNAVAILABLE = 4
EXIT_NOT_PROVEN = 5

GROUNDS = ("weights_total", "node_weights", "probe")
"""The only grounds of a "does not fit" (exit 3), each true of the real compiler: the distinct
weights the file stores alone (no margin) exceed all devices' memory together; one node's weights
(folded constants it reads included) alone exceed a device; one node compiled alone on one device
at the lowest AMP ran out of memory (the probe; docs/planning.md says why each holds)."""


class SharderdError(Exception):
    """Base of every expected failure. ``reason`` is a stable machine-readable slug.

    ``hint`` says what to do as the command line says it; ``reruns`` says the same as data, for
    the Python API to say in its own terms: each entry is one way past the error, the planning
    options a rerun changes by their keyword (``{"devices": 5}``, ``{"name_nodes": True}``;
    ``{"backend": "poprt"}``: let a compile decide).
    """

    exit_code: ClassVar[int] = EXIT_FAILED
    reason: ClassVar[str] = "error"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        reruns: tuple[Mapping[str, object], ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.reruns = tuple(dict(r) for r in reruns)

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}\n{self.hint}"

    def to_dict(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class ConfigError(SharderdError):
    """A config file, sidecar or command-line option is wrong; the message names the key."""

    exit_code = EXIT_BAD_INPUT
    reason = "bad_config"


class ModelInvalidError(SharderdError):
    """The model cannot be read or violates a rule sharderd needs (names, shapes, paths).

    Raised by the loader and validator. The user fixes the model, or passes ``--name-nodes``
    where the message says so.
    """

    exit_code = EXIT_BAD_INPUT
    reason = "bad_model"


class DimsUnresolvedError(SharderdError):
    """Symbolic input dims nothing gave a value: sharderd never plans on guessed sizes.

    ``dims`` holds ``(input, axis, dim_name)`` for each, so the CLI and the daemon can show the
    flag or the sidecar line that sets it.
    """

    exit_code = EXIT_BAD_INPUT
    reason = "unresolved_dims"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        dims: tuple[tuple[str, int, str], ...] = (),
        templates: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.dims = dims
        self.templates = dict(templates or {})
        """Input → its shape with known dims filled and ``<size>`` for the open ones."""

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "dims": [list(d) for d in self.dims]}


class NoSplitError(SharderdError):
    """The search ended without a split that fits: proven (``PlanInfeasibleError``, exit 3) or not
    (``NotProvenError``, exit 5). Code that only needs "this model has no split" catches this.

    ``min_devices`` is how many devices would do (None when no number is known to help).
    """

    proven: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        reruns: tuple[Mapping[str, object], ...] = (),
        device: int | None = None,
        short_bytes: int | None = None,
        min_devices: int | None = None,
        fits_without_margin: bool = False,
    ) -> None:
        super().__init__(message, hint=hint, reruns=reruns)
        self.device = device
        self.short_bytes = short_bytes
        self.min_devices = min_devices
        self.fits_without_margin = fits_without_margin
        """True when only the safety margin rules the split out: a compile may still prove it."""
        self.node: str | None = None
        """Set when one node alone does not fit (no number of devices helps)."""
        self.node_need: float = 0.0
        """That node's need / device capacity."""
        self.node_activation_share: float = 0.0
        """Its inputs and outputs / its need: where conv/matmul temporaries live."""

    @property
    def grounds(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, object]:
        return {
            **super().to_dict(),
            "device": self.device,
            "short_bytes": self.short_bytes,
            "min_devices": self.min_devices,
            "fits_without_margin": self.fits_without_margin,
            "proven": self.proven,
            "grounds": self.grounds,
            "node": self.node,
            "node_need": self.node_need,
            "node_activation_share": self.node_activation_share,
        }


class PlanInfeasibleError(NoSplitError):
    """No split onto the requested devices fits, proven on one of ``GROUNDS`` (``grounds``).

    ``node`` names the node when one node alone rules every split out (no number of devices helps).
    """

    exit_code = EXIT_DOES_NOT_FIT
    reason = "does_not_fit"
    proven = True

    def __init__(
        self,
        message: str,
        *,
        grounds: str,
        hint: str | None = None,
        reruns: tuple[Mapping[str, object], ...] = (),
        device: int | None = None,
        short_bytes: int | None = None,
        min_devices: int | None = None,
        node: str | None = None,
    ) -> None:
        if grounds not in GROUNDS:
            raise ValueError(f"not a ground of a proof: {grounds!r}")
        super().__init__(
            message,
            hint=hint,
            reruns=reruns,
            device=device,
            short_bytes=short_bytes,
            min_devices=min_devices,
        )
        self._grounds = grounds
        self.node = node

    @property
    def grounds(self) -> str:
        return self._grounds


class NotProvenError(NoSplitError):
    """No fitting split was found, and none of ``GROUNDS`` proves there is none (exit 5).

    Estimates with a margin, fitted factors, a search that is not exhaustive or a spent compile
    budget end here; the message says what was tried and what the compiles showed, and the hint
    is a command for the device count the measurements suggest (``min_devices``), when known.
    """

    exit_code = EXIT_NOT_PROVEN
    reason = "not_proven"


class BackendUnavailableError(SharderdError):
    """The requested backend cannot run here (e.g. poprt without the Poplar SDK)."""

    exit_code = EXIT_BACKEND_UNAVAILABLE
    reason = "backend_unavailable"


class CompileFailedError(SharderdError):
    """Every compile attempt failed for a reason other than memory; the report lists them."""

    exit_code = EXIT_FAILED
    reason = "compile_failed"


class OutputWriteError(SharderdError):
    """Results could not be written (disk full, permission denied); the input is kept for a retry."""

    exit_code = EXIT_FAILED
    reason = "cannot_write"

    @classmethod
    def of(cls, exc: OSError, what: str, where: object) -> OutputWriteError:
        return cls(
            f"cannot write {what} to {where}: {exc.strerror or exc}",
            hint=f"{os_error_advice(exc, 'the output folder')}, then retry the job",
        )


class VerificationError(SharderdError):
    """The sharded model computes something different from the original."""

    exit_code = EXIT_FAILED
    reason = "verification_failed"


class WorkerDiedError(SharderdError):
    """The planning worker ended without answering. ``signal`` is what killed it, else None.

    A worker that exits with a status ran into a Python error that will recur; one killed by a
    signal (the OOM killer, a segfault) may have been a victim of memory pressure, so the daemon
    runs its job again.
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        exit_status: int | None = None,
        signal: int | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.signal = signal


# -- the daemon's job failures (``failed/<name>/error.json`` carries ``reason``) ----------------


class BadJobError(SharderdError):
    """The inbox entry can never be a job (two models in a folder, a link, an unreadable folder)."""

    reason = "bad_job"


class WorkerCrashedError(SharderdError):
    """The planning worker, or the daemon itself, died during every run the job was allowed."""

    reason = "worker_crashed"


class PlanningLimitError(SharderdError):
    """A job's planning worker went past its time or memory limit and was stopped.

    ``limit`` is ``"time"`` or ``"memory"``; ``key`` the setting that sets it (``planning_timeout``,
    ``planning_memory_bytes`` in ``[daemon]``); ``allowed`` its value and ``used`` what the worker
    had spent when it was stopped (seconds or bytes).
    """

    reason = "planning_limit"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        limit: str,
        key: str,
        allowed: float,
        used: float,
    ) -> None:
        super().__init__(message, hint=hint)
        self.limit = limit
        self.key = key
        self.allowed = allowed
        self.used = used

    def to_dict(self) -> dict[str, object]:
        return {
            **super().to_dict(),
            "limit": self.limit,
            "key": self.key,
            "allowed": self.allowed,
            "used": self.used,
        }


class JobCancelledError(SharderdError):
    """Someone asked for the job to stop (``sharderd cancel``, ``inbox/<name>.cancel``)."""

    reason = "cancelled"


class InternalError(SharderdError):
    """A bug in sharderd ended the job; the daemon log has the traceback."""

    reason = "internal_error"

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        return cls(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="This is a bug in sharderd. The daemon log has the traceback (search it for this job id); "
            "please report it with that traceback attached.",
        )


class StorageError(SharderdError):
    """The daemon could not read or write the job's files (disk full, permissions): not a bug."""

    reason = "storage"

    @classmethod
    def of(cls, exc: OSError) -> StorageError:
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno == errno.ENAMETOOLONG:
            advice = os_error_advice(exc, "that folder")
            hint = f"{advice[0].upper()}{advice[1:]}, then move the input back into the inbox."
        else:
            hint = (
                "Free disk space or give the sharderd user access to that folder (inbox, outbox "
                "and state_dir must stay writable), then move the input back into the inbox."
            )
        return cls(
            f"sharderd could not read or write this job's files: {exc.strerror or exc}{where}",
            hint=hint,
        )


def sole_exception(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (anyio task groups always wrap)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
