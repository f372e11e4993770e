"""structlog set-up: one JSON object per line on stdout, for journald and for the tests.

Everything goes through one stdlib handler, so sharderd's own events and the ``logging`` records of
libraries (onnx, ray) share one renderer, one lock and one schema: ``ts`` (UTC ISO 8601),
``level``, ``event``, plus the bound context (``job_id``...). Foreign records also carry ``logger``.

Event names are a closed vocabulary (``EVENTS``) so dashboards and alerts can rely on them. An
unregistered name is a bug in sharderd, but a log call must never take the daemon down: by default
the line is kept and tagged ``unregistered=true``; ``strict_events=True`` (the tests) raises
``UnregisteredEventError`` at the call site instead. ``tests/test_logs.py`` also checks every
literal event name in the package source against the registry.
"""

from __future__ import annotations

import json as _json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Final, final

import structlog
from structlog.processors import ExceptionRenderer
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import FilteringBoundLogger, Processor

from sharderd.filenames import text_values

__all__ = [
    "EVENTS",
    "MAX_LINE_BYTES",
    "CheckEvent",
    "EscapeBytes",
    "Truncate",
    "UnregisteredEventError",
    "configure_logging",
    "get_logger",
]

EVENTS: Final[frozenset[str]] = frozenset(
    {
        "daemon.started",
        "daemon.ready",
        "daemon.stopping",
        "daemon.stopped",
        "daemon.error",
        "daemon.refused",
        "watch.started",
        "watch.restarted",
        "watch.failed",
        "watch.renames_unavailable",
        "scan.finished",
        "job.detected",
        "job.claimed",
        "job.resumed",
        "job.skipped",
        "plan.started",
        "plan.finished",
        "attempt.started",
        "attempt.finished",
        "attempt.timeout",
        "attempt.submitted",
        "attempt.ran",
        "attempt.stderr",
        "attempt.artifact_mismatch",
        "attempt.force_cancelled",
        "cluster.connected",
        "cluster.lost",
        "cluster.restored",
        "cluster.message",
        "job.succeeded",
        "job.failed",
        "job.duplicate",
        "job.cancelled",
        "job.retried",
        "outbox.written",
        "journal.recovered",
        "status.written",
        "metrics.written",
        "metrics.served",
        "cancel.requested",
        "cancel.ignored",
        "config.loaded",
        "backend.selected",
        "env.unset",
        "notify.failed",
    }
)
"""Every event name sharderd may log, ``noun.verb``; add a name here before logging it."""

MAX_LINE_BYTES: Final = 16 * 1024
"""Longest rendered line, newline included; far below journald's 48 KiB ``LineMax``."""

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_HANDLER_NAME: Final = "sharderd"


class UnregisteredEventError(ValueError):
    """A log call used an event name missing from ``EVENTS`` (strict mode only)."""


@final
class CheckEvent:
    """Tag (or, strict, refuse) events whose name is not in the registry."""

    __slots__ = ("_events", "_strict")

    def __init__(self, events: frozenset[str] = EVENTS, *, strict: bool = False) -> None:
        self._events = events
        self._strict = strict

    def __call__(
        self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        name = event_dict.get("event")
        if name in self._events:
            return event_dict
        if self._strict:
            raise UnregisteredEventError(
                f"log event {name!r} is not registered in sharderd.logs.EVENTS"
            )
        event_dict["unregistered"] = True
        return event_dict


@final
class Truncate:
    """Shorten the largest fields until the rendered line fits ``max_bytes``; sets ``truncated``.

    Sizes are measured with the renderer's own ``json.dumps`` (ASCII-escaped, so characters are
    bytes). The largest fields go first; a non-string field (a traceback) is cut as its JSON text.
    ``ts`` and ``level`` are never cut; if huge key names alone overflow, only the core remains.
    """

    __slots__ = ("_keep", "_max")

    def __init__(
        self,
        max_bytes: int = MAX_LINE_BYTES - 1,
        *,
        keep: frozenset[str] = frozenset({"ts", "level"}),
    ) -> None:
        self._max = max_bytes
        self._keep = keep

    def __call__(
        self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if _size(event_dict) <= self._max:
            return event_dict
        event_dict["truncated"] = True
        for key in sorted(event_dict.keys() - self._keep, key=lambda k: -_size(event_dict[k])):
            excess = _size(event_dict) - self._max
            if excess <= 0:
                return event_dict
            event_dict[key] = _cut(event_dict[key], _size(event_dict[key]) - excess)
        if _size(event_dict) > self._max:  # thousands of fields or huge key names
            return {
                k: event_dict[k] for k in ("ts", "level", "event", "truncated") if k in event_dict
            }
        return event_dict


def _size(value: object) -> int:
    return len(_json.dumps(value, default=repr))


def _cut(value: object, budget: int) -> str:
    """``value`` as text of at most ``budget`` JSON bytes, keeping its head.

    Each round drops the excess at the average byte cost per character, at least one character, so
    it ends; escaping-heavy text may take a few rounds.
    """
    text = value if isinstance(value, str) else _json.dumps(value, default=repr)
    marker = f"...[truncated from {len(text)} chars]"
    keep = len(text)
    while keep > 0:
        size = _size(text[:keep] + marker)
        if size <= budget:
            return text[:keep] + marker
        keep -= max(1, -(-(size - budget) * keep // size))
    return marker


@final
class EscapeBytes:
    """Show each byte of a value that is not UTF-8 (a file name's, as ``os.fsdecode`` gives it) as
    ``%XX`` (``filenames.text``): the line stays valid UTF-8 JSON, and writing it cannot fail."""

    __slots__ = ()

    def __call__(
        self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in event_dict.items():
            event_dict[key] = text_values(value)
        return event_dict


_dict_tracebacks: Final = ExceptionRenderer(
    ExceptionDictTransformer(show_locals=False, max_frames=20)
)
"""Tracebacks as JSON data, without locals (they leak paths and tensors and blow the line size)."""


def configure_logging(
    *, json: bool | None = None, level: str = "info", strict_events: bool = False
) -> None:
    """Install the pipeline once at start-up; calling it again replaces the previous set-up.

    ``json=None`` picks JSON unless stdout is a terminal. The handler is bound to ``sys.stdout`` as
    it is now (tests capture it).
    """
    levelno = _LEVELS.get(level.lower())
    if levelno is None:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}")
    if json is None:
        json = not sys.stdout.isatty()
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        timestamper,
    ]
    render: list[Processor] = (
        [_dict_tracebacks, EscapeBytes(), Truncate(), structlog.processors.JSONRenderer()]
        if json
        else [EscapeBytes(), structlog.dev.ConsoleRenderer(timestamp_key="ts")]
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(levelno)
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            *shared,
            CheckEvent(strict=strict_events),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(levelno),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger named ``name`` (a module's ``__name__``); safe to create before ``configure_logging``."""
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger
