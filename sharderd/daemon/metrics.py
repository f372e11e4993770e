"""Prometheus metrics of the daemon: a textfile for node_exporter and, optionally, a localhost port.

The exposition (text format 0.0.4) is written here, without a dependency, from ``DaemonFigures``:
a frozen snapshot the status board takes each time it publishes ``status.json`` (on changes, at
most every 0.5 s, and at least every 15 s). The textfile is replaced atomically (temp file in the
same folder, then rename) with mode 0644, so node_exporter never reads half a file whatever the
service's umask; the temp name does not end in ``.prom``, so the collector never picks it up.

``metrics_port`` serves the same text through ``prometheus-client`` when it is installed (an
optional extra, never a hard dependency). Its HTTP server runs in a thread of the library's own;
that thread only reads the last rendered string, which the event loop replaces whole, so nothing
is shared that could be seen half-updated.

Counters count since the daemon started (Prometheus handles the reset at a restart);
``sharderd_start_time_seconds`` tells when that was. The attempt histogram covers attempts that
reached an outcome; attempts killed with their job (cancel, shutdown, a faster plan winning) count
in ``sharderd_attempts_total{outcome="cancelled"}`` only, as they have no meaningful duration.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
import platform
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, final

import anyio
import anyio.to_thread

from sharderd.backends.protocol import OUTCOMES
from sharderd.backends.registry import PROVEN_STATUS
from sharderd.errors import ConfigError
from sharderd.fsutil import atomic_write
from sharderd.logs import get_logger

__all__ = [
    "ATTEMPT_BUCKETS_S",
    "JOB_OUTCOMES",
    "AttemptStats",
    "DaemonFigures",
    "MetricsExporter",
    "render_metrics",
]

_log = get_logger(__name__)

ATTEMPT_BUCKETS_S: Final[tuple[float, ...]] = (
    1,
    5,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
)
"""Upper bounds of the attempt duration histogram: a toy model compiles in a second, a large one
on PopRT in tens of minutes, and ``attempt_timeout`` defaults to an hour."""
JOB_OUTCOMES: Final[tuple[str, ...]] = ("succeeded", "failed", "duplicate", "cancelled")
"""Every job outcome label, exported from 0 so ``rate()`` sees the first increment."""


@dataclass(slots=True)
class AttemptStats:
    """Compile attempts by outcome and a duration histogram; fed by the job tasks."""

    outcomes: Counter[str] = field(default_factory=Counter)
    buckets: list[int] = field(default_factory=lambda: [0] * len(ATTEMPT_BUCKETS_S))
    """Per-bucket (not yet cumulative) counts; a duration above the last bound is only in ``count``."""
    seconds: float = 0.0
    count: int = 0

    def observe(self, outcome: str, duration_s: float) -> None:
        self.outcomes[outcome] += 1
        k = bisect.bisect_left(ATTEMPT_BUCKETS_S, duration_s)
        if k < len(self.buckets):
            self.buckets[k] += 1
        self.seconds += duration_s
        self.count += 1

    def cumulative(self) -> tuple[int, ...]:
        """Bucket counts as exported: each includes every shorter bucket."""
        return tuple(itertools.accumulate(self.buckets))

    def cancelled(self, n: int) -> None:
        """``n`` attempts were killed without an outcome (their job ended first)."""
        if n > 0:
            self.outcomes["cancelled"] += n


@dataclass(frozen=True, slots=True)
class DaemonFigures:
    """Everything a scrape reports, taken at one instant."""

    version: str
    up: bool
    start_time: float
    now: float
    jobs: Mapping[str, int]
    results: Mapping[str, int]
    """Succeeded jobs by report ``status``: compiled, verified, not_compiled."""
    attempts: Mapping[str, int]
    cumulative_buckets: tuple[int, ...]
    duration_sum_s: float
    duration_count: int
    pending: int
    processing: int
    pool_busy: int
    pool_waiting: int
    pool_slots: int
    last_success: float | None


def render_metrics(f: DaemonFigures) -> str:
    """The Prometheus text exposition of ``f``."""
    return "".join(_families(f))


def _families(f: DaemonFigures) -> Iterator[str]:
    yield from _family(
        "sharderd_up",
        "gauge",
        "1 while the daemon runs; 0 once it stopped cleanly.",
        [({}, int(f.up))],
    )
    yield from _family(
        "sharderd_build_info",
        "gauge",
        "Always 1; the labels say which sharderd runs.",
        [({"version": f.version, "python": platform.python_version()}, 1)],
    )
    yield from _family(
        "sharderd_start_time_seconds",
        "gauge",
        "When the daemon started (UNIX time).",
        [({}, f.start_time)],
    )
    yield from _family(
        "sharderd_heartbeat_timestamp_seconds",
        "gauge",
        "When this was rendered (UNIX time); older than 30 s means a hung or dead daemon.",
        [({}, f.now)],
    )
    yield from _family(
        "sharderd_jobs_total",
        "counter",
        "Jobs that reached an outcome since the daemon started.",
        [({"outcome": o}, f.jobs.get(o, 0)) for o in _labels(JOB_OUTCOMES, f.jobs)],
    )
    yield from _family(
        "sharderd_results_total",
        "counter",
        "Jobs that succeeded since the daemon started, by what proved their plan: compiled (PopRT "
        "compiled it), verified (onnxruntime ran the stages and checked them; nothing compiled), "
        "not_compiled (backend none).",
        [
            ({"status": s}, f.results.get(s, 0))
            for s in _labels(tuple(PROVEN_STATUS.values()), f.results)
        ],
    )
    yield from _family(
        "sharderd_attempts_total",
        "counter",
        "Attempts (PopRT compiles, onnxruntime runs) by outcome since the daemon started.",
        [({"outcome": o}, f.attempts.get(o, 0)) for o in _labels(OUTCOMES, f.attempts)],
    )
    buckets = [
        ({"le": _number(b)}, n)
        for b, n in zip(ATTEMPT_BUCKETS_S, f.cumulative_buckets, strict=True)
    ]
    yield from _family(
        "sharderd_attempt_duration_seconds",
        "histogram",
        "Duration of attempts that reached an outcome.",
        [*buckets, ({"le": "+Inf"}, f.duration_count)],
        sum_count=(f.duration_sum_s, f.duration_count),
    )
    yield from _family(
        "sharderd_queue_depth",
        "gauge",
        "Jobs waiting in the inbox (pending) and claimed, not finished (processing).",
        [({"state": "pending"}, f.pending), ({"state": "processing"}, f.processing)],
    )
    yield from _family(
        "sharderd_pool_busy_slots", "gauge", "Attempt slots in use.", [({}, f.pool_busy)]
    )
    yield from _family(
        "sharderd_pool_waiting_attempts",
        "gauge",
        "Attempts waiting for a slot.",
        [({}, f.pool_waiting)],
    )
    yield from _family(
        "sharderd_pool_slots",
        "gauge",
        "Attempt slots (max_parallel_compiles).",
        [({}, f.pool_slots)],
    )
    yield from _family(
        "sharderd_last_success_timestamp_seconds",
        "gauge",
        "When a job last succeeded (UNIX time; 0 when none did in the 24 h before the start).",
        [({}, f.last_success or 0)],
    )


def _labels(known: Iterable[str], seen: Mapping[str, int]) -> list[str]:
    return [*known, *sorted(k for k in seen if k not in known)]


def _family(
    name: str,
    kind: str,
    help_text: str,
    samples: list[tuple[Mapping[str, str], float]],
    *,
    sum_count: tuple[float, int] | None = None,
) -> Iterator[str]:
    yield f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
    suffix = "_bucket" if kind == "histogram" else ""
    for labels, value in samples:
        yield f"{name}{suffix}{_label_text(labels)} {_number(value)}\n"
    if sum_count is not None:
        yield f"{name}_sum {_number(sum_count[0])}\n{name}_count {sum_count[1]}\n"


def _label_text(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) or (
        isinstance(value, float) and value.is_integer() and abs(value) < 2**53
    ):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@final
class MetricsExporter:
    """Writes the textfile and feeds the optional HTTP endpoint; inert when neither is configured."""

    __slots__ = ("_collector", "_last_error", "_server", "port", "textfile")

    def __init__(self, textfile: Path | None, port: int | None) -> None:
        self.textfile = textfile
        self.port = port
        self._server: Any = None
        self._collector: _TextCollector | None = None
        self._last_error = ""

    @property
    def enabled(self) -> bool:
        return self.textfile is not None or self.port is not None

    def start(self) -> None:
        """Bind the localhost port, if one is configured. ``ConfigError`` when it cannot be served."""
        if self.port is None:
            return
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigError(
                f"metrics_port = {self.port} needs the prometheus-client package, which is not installed",
                hint="`python3 -m pip install prometheus-client`, or unset metrics_port and use metrics_textfile.",
            ) from None
        self._collector = _TextCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        try:
            self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on 127.0.0.1:{self.port}: {exc.strerror or exc}",
                hint="Pick a free port, or unset metrics_port. Under the shipped systemd unit "
                "(PrivateNetwork=yes, RestrictAddressFamilies=AF_UNIX) use metrics_textfile.",
            ) from None
        self.port = int(self._server.server_port)
        _log.info("metrics.served", url=f"http://127.0.0.1:{self.port}/metrics")

    def publish(self, figures: DaemonFigures) -> None:
        """Render ``figures``; write the textfile and hand the text to the server. Never raises."""
        if not self.enabled:
            return
        text = render_metrics(figures)
        if self._collector is not None:
            self._collector.text = text
        if self.textfile is None:
            return
        try:
            atomic_write(self.textfile, text, mode=0o644, exact_mode=True, durable=False)
        except OSError as exc:
            error = f"{exc.strerror or exc}: {exc.filename or self.textfile}"
            if error != self._last_error:  # once per distinct problem, not every half second
                _log.warning(
                    "metrics.written",
                    ok=False,
                    path=str(self.textfile),
                    error=error,
                    hint="The folder must exist and be writable by the daemon (a ReadWritePaths= drop-in "
                    "under systemd).",
                )
            self._last_error = error
        else:
            if self._last_error:
                _log.info("metrics.written", ok=True, path=str(self.textfile))
            self._last_error = ""

    async def aclose(self) -> None:
        """Stop serving; the textfile stays (node_exporter's mtime metric shows its age)."""
        server, self._server = self._server, None
        if server is not None:
            await anyio.to_thread.run_sync(server.shutdown)  # waits for the server's poll loop
            with contextlib.suppress(OSError):
                server.server_close()


@final
class _TextCollector:
    """A prometheus-client collector over the last rendered exposition."""

    __slots__ = ("text",)

    def __init__(self) -> None:
        self.text = ""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.parser import text_string_to_metric_families

        yield from text_string_to_metric_families(self.text)
