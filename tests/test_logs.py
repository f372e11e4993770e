"""sharderd.logs: one JSON object per line, registered event names, bounded line length."""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog

from sharderd.logs import (
    EVENTS,
    MAX_LINE_BYTES,
    CheckEvent,
    Truncate,
    UnregisteredEventError,
    configure_logging,
    get_logger,
)

PACKAGE = Path(__file__).resolve().parent.parent / "sharderd"
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "msg", "fatal"}


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


class TestJsonOutput:
    def test_event_line_has_ts_level_event(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A registered event renders as one JSON line with a UTC ISO ``ts``, ``level`` and ``event``."""
        configure_logging(json=True, strict_events=True)
        get_logger("sharderd.test").info("daemon.started", version="0.1.0")
        [line] = lines(capsys)
        assert line["event"] == "daemon.started"
        assert line["level"] == "info"
        assert line["version"] == "0.1.0"
        ts = datetime.fromisoformat(str(line["ts"]))
        assert ts.utcoffset() == timedelta(0)
        assert abs(datetime.now(UTC) - ts) < timedelta(minutes=1)

    def test_contextvars_are_merged(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``job_id`` bound at claim time appears on every later line of that context."""
        configure_logging(json=True, strict_events=True)
        structlog.contextvars.bind_contextvars(job_id="J1")
        log = get_logger("sharderd.test")
        log.info("job.claimed")
        log.bind(attempt=2).info("attempt.started")
        first, second = lines(capsys)
        assert (first["job_id"], second["job_id"], second["attempt"]) == ("J1", "J1", 2)

    def test_level_filters_debug(self, capsys: pytest.CaptureFixture[str]) -> None:
        """At level info a debug event produces no output; at debug it does."""
        configure_logging(json=True, level="info")
        get_logger("sharderd.test").debug("job.skipped")
        assert capsys.readouterr().out == ""
        configure_logging(json=True, level="debug")
        get_logger("sharderd.test").debug("job.skipped")
        assert [line["event"] for line in lines(capsys)] == ["job.skipped"]

    def test_unknown_level_is_refused(self) -> None:
        """A misspelt level is an error naming the valid ones."""
        with pytest.raises(ValueError, match="verbose"):
            configure_logging(level="verbose")

    def test_exception_is_a_json_field(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``log.exception`` renders the traceback as structured data, not a text blob."""
        configure_logging(json=True, strict_events=True)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            get_logger("sharderd.test").exception("daemon.error")
        [line] = lines(capsys)
        assert line["level"] == "error"
        [exc] = line["exception"]  # type: ignore[misc]
        assert (exc["exc_type"], exc["exc_value"]) == ("RuntimeError", "boom")
        assert exc["frames"]

    def test_console_renderer_on_request(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``json=False`` gives readable text that is not JSON; ``json=None`` on a pipe gives JSON."""
        configure_logging(json=False)
        get_logger("sharderd.test").info("daemon.ready")
        text = capsys.readouterr().out
        assert "daemon.ready" in text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
        configure_logging()  # capsys' stdout is not a TTY
        get_logger("sharderd.test").info("daemon.ready")
        assert lines(capsys)[0]["event"] == "daemon.ready"


class TestRegistry:
    def test_unregistered_event_raises_in_strict_mode(self) -> None:
        """In strict mode (tests) an unknown event name fails at the call site."""
        configure_logging(json=True, strict_events=True)
        with pytest.raises(UnregisteredEventError, match=r"job\.exploded"):
            get_logger("sharderd.test").info("job.exploded")

    def test_unregistered_event_is_tagged_in_production(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """By default an unknown name is still logged, tagged ``unregistered``."""
        configure_logging(json=True)
        get_logger("sharderd.test").warning("job.exploded")
        [line] = lines(capsys)
        assert (line["event"], line["unregistered"]) == ("job.exploded", True)

    def test_check_event_direct(self) -> None:
        """The processor passes registered names through untouched."""
        assert CheckEvent(strict=True)(None, "info", {"event": "job.failed"}) == {
            "event": "job.failed"
        }
        assert CheckEvent()(None, "info", {"event": "nope"}) == {
            "event": "nope",
            "unregistered": True,
        }

    def test_event_names_are_noun_verb(self) -> None:
        """Every registered name is ``noun.verb`` in lower case."""
        assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", name) for name in EVENTS)

    def test_package_logs_only_registered_events(self) -> None:
        """Every literal event name passed to a logger in the package source is registered."""
        used: dict[str, str] = {}
        for path in PACKAGE.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS
                    and _is_logger(node.func.value)
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    used[node.args[0].value] = f"{path.relative_to(PACKAGE)}:{node.lineno}"
        assert "notify.failed" in used  # the scan sees real call sites
        unknown = {name: where for name, where in used.items() if name not in EVENTS}
        assert unknown == {}


def _is_logger(node: ast.expr) -> bool:
    """``log``, ``_log``, ``logger``, ``self.log``... and ``<those>.bind(...)``."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"bind", "new"}
    ):
        node = node.func.value
    name = (
        node.attr
        if isinstance(node, ast.Attribute)
        else node.id
        if isinstance(node, ast.Name)
        else ""
    )
    return re.fullmatch(r"_?(log|logger|blog)", name, re.IGNORECASE) is not None


class TestTruncate:
    def test_small_event_untouched(self) -> None:
        """An event under the limit is returned as is, without a ``truncated`` key."""
        event = {"event": "job.failed", "message": "x" * 100}
        assert Truncate(1000)(None, "error", dict(event)) == event

    def test_long_string_is_cut_to_fit(self) -> None:
        """A field far over the limit is shortened so the whole event renders within it."""
        event = Truncate(1000)(
            None, "error", {"event": "job.failed", "ts": "t", "stderr": 'é"' * 5000}
        )
        rendered = json.dumps(event)
        assert len(rendered) <= 1000
        assert event["truncated"] is True
        assert (
            event["stderr"].startswith('é"é"') and "truncated from 10000 chars" in event["stderr"]
        )

    def test_nested_value_becomes_text(self) -> None:
        """A structured field (a traceback) that must shrink is kept as cut JSON text."""
        frames = [{"filename": f"/x/{i}.py", "line": i, "name": "f" * 50} for i in range(500)]
        event = Truncate(2000)(None, "error", {"event": "daemon.error", "exception": frames})
        assert len(json.dumps(event)) <= 2000
        assert event["exception"].startswith('[{"filename"')

    def test_rendered_line_stays_under_limit(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A huge field and a huge traceback still produce one parseable line under 16 KiB."""
        configure_logging(json=True, strict_events=True)
        try:
            raise ValueError("v" * 100_000)
        except ValueError:
            get_logger("sharderd.test").exception("attempt.finished", stderr_tail="s" * 100_000)
        out = capsys.readouterr().out
        assert out.count("\n") == 1
        assert len(out.encode()) <= MAX_LINE_BYTES
        line = json.loads(out)
        assert (line["event"], line["truncated"]) == ("attempt.finished", True)


class TestStdlib:
    def test_library_record_is_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A ``logging`` record from a library comes out in the same schema, with ``logger``."""
        configure_logging(json=True, strict_events=True)
        structlog.contextvars.bind_contextvars(job_id="J7")
        logging.getLogger("onnx.checker").warning("odd %s", "model")
        [line] = lines(capsys)
        assert line["event"] == "odd model"
        assert (line["level"], line["logger"], line["job_id"]) == ("warning", "onnx.checker", "J7")
        assert datetime.fromisoformat(str(line["ts"])).utcoffset() == timedelta(0)

    def test_warnings_are_captured(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``warnings.warn`` from a library becomes a JSON line too."""
        import warnings

        configure_logging(json=True)
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
        [line] = lines(capsys)
        assert line["logger"] == "py.warnings" and "deprecated thing" in str(line["event"])
