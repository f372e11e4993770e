"""How an onnxruntime attempt ends early with a verdict rather than an exception.

onnxruntime's exceptions share no base class but ``Exception`` and carry multi-line C++ text;
every module of the backend turns them into an ``AttemptFailure`` that ``run_attempt`` alone
catches, so a verdict (``invalid``, ``oom``) is decided where the cause is known.
"""

from __future__ import annotations

from sharderd.backends.protocol import Cause, OomInfo, Outcome

__all__ = ["AttemptFailure", "error_text"]


class AttemptFailure(Exception):
    """Ends an attempt with ``outcome``; caught in ``run_attempt`` only."""

    def __init__(
        self, outcome: Outcome, message: str, oom: OomInfo | None = None, cause: Cause | None = None
    ) -> None:
        super().__init__(message)
        self.outcome: Outcome = outcome
        self.message = message
        self.oom = oom
        self.cause: Cause | None = cause


def error_text(exc: Exception) -> str:
    """The first three non-empty lines of an onnxruntime error, at most 1000 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:3])[:1000] or type(exc).__name__
