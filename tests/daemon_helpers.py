"""Drive a real ``sharderd run`` process: temp folders, a config, its JSON log lines, ``/proc``.

``DaemonProcess`` reads the daemon's stdout with ``select`` (no threads, no sleeps): every wait is
"read lines until this event arrives or the deadline passes", and the pause between chunks of a
slow copy is spent reading too, so the daemon never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import onnx

from sharderd import examples
from sharderd.logs import EVENTS

REPO = Path(__file__).resolve().parent.parent
FAKE_POPRT = REPO / "tests" / "fake_poprt"
MARKER_VAR = "SHARDERD_TEST_MARKER"
"""Set in the daemon's environment; its children inherit it, so /proc finds every one of them."""
_F_SETPIPE_SZ = 1031


def write_config(root: Path, **daemon: Any) -> Path:
    """``root/sharderd.toml`` with folders under ``root``, fast settling and backend none."""
    settings: dict[str, Any] = {
        "inbox": root / "inbox",
        "outbox": root / "outbox",
        "state_dir": root / "state",
        "runtime_dir": root / "run",
        "backend": "none",
        "devices": 2,
        "settle_seconds": 0.5,
        "rescan_interval": 1.0,
        "kill_grace": 1.0,
        "allow_root": os.geteuid() == 0,
        **daemon,
    }
    lines = ["[daemon]", *(f"{key} = {_toml(value)}" for key, value in settings.items())]
    path = root / "sharderd.toml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return repr(value)


def chain_model(seed: int = 0, *, name_nodes: bool = True, hidden: int = 8) -> onnx.ModelProto:
    """A 20-node model; a different ``seed`` gives different weights (so not a duplicate)."""
    return examples.chain(nodes=20, hidden=hidden, seed=seed, name_nodes=name_nodes)


def save_model(model: onnx.ModelProto, path: Path, *, external_data: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return examples.save(model, path, external_data=external_data)


def planworker_hook(root: Path, code: str) -> dict[str, str]:
    """Environment that runs ``code`` first thing in every planning worker (and nowhere else).

    A ``sitecustomize`` on ``PYTHONPATH`` runs at interpreter start in the daemon and all its
    children; it acts only when the command line names the planning worker.
    """
    hooks = root / "hooks"
    hooks.mkdir(exist_ok=True)
    body = "".join(f"    {line}\n" for line in code.splitlines())
    (hooks / "sitecustomize.py").write_text(
        f"import os, signal, sys, time\nif 'sharderd.job.planworker' in sys.orig_argv:\n{body}"
    )
    return {"PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)])}


def staged(root: Path, name: str, seed: int = 0, *, name_nodes: bool = True) -> Path:
    """A finished model file ``root/models/<name>.onnx`` outside the inbox (same filesystem), ready
    to be renamed in."""
    return save_model(chain_model(seed, name_nodes=name_nodes), root / "models" / f"{name}.onnx")


def drop(src: Path, inbox: Path, name: str | None = None) -> Path:
    """Move a finished file or folder into the inbox with one rename (how a careful writer delivers)."""
    dest = inbox / (name or src.name)
    src.rename(dest)
    return dest


def ts(line: Mapping[str, Any]) -> float:
    """A log line's ``ts`` as a UNIX time."""
    return dt.datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00")).timestamp()


def marked_processes(token: str) -> list[int]:
    """Pids of live processes whose environment holds ``MARKER_VAR=token``."""
    needle = f"{MARKER_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state not in "ZX":
            found.append(int(entry.name))
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class DaemonProcess:
    """One ``python -m sharderd.cli run --config CFG`` child and everything it logged."""

    def __init__(
        self, config: Path, *, env: Mapping[str, str] | None = None, fake_poprt: bool = False
    ) -> None:
        self.config = config
        self.token = secrets.token_hex(8)
        paths = [str(FAKE_POPRT)] if fake_poprt else []
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FAKE_POPRT_", "NOTIFY_", "WATCHDOG_"))
        }
        self.env = {
            **base,
            "PYTHONPATH": os.pathsep.join(
                [*paths, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            MARKER_VAR: self.token,
            **(env or {}),
        }
        self.lines: list[dict[str, Any]] = []
        self.stderr = ""
        self._buffers = {"out": b"", "err": b""}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sharderd.cli", "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._fds = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}
        for fd in self._fds:
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- reading -----------------------------------------------------------------------------

    def pump(self, seconds: float) -> None:
        """Read whatever the daemon writes during ``seconds`` (also the tests' way to pause)."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._fds:
                return
            ready, _, _ = select.select(list(self._fds), [], [], left)
            for fd in ready:
                self._read(fd)

    def _read(self, fd: int) -> None:
        which = self._fds[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            del self._fds[fd]
            chunk = b"\n"
        data = self._buffers[which] + chunk
        *complete, self._buffers[which] = data.split(b"\n")
        for raw in complete:
            if not raw.strip():
                continue
            if which == "err":
                self.stderr += raw.decode(errors="replace") + "\n"
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"event": "<not json>", "raw": raw.decode(errors="replace")}
            self.lines.append(line)

    def events(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            ln
            for ln in self.lines
            if ln.get("event") == event and all(ln.get(k) == v for k, v in fields.items())
        ]

    def wait_for(
        self, event: str, *, count: int = 1, timeout: float = 30.0, **fields: Any
    ) -> list[dict[str, Any]]:
        """Read until ``count`` lines of ``event`` (with these field values) were logged in all."""
        self.wait_until(
            lambda: len(self.events(event, **fields)) >= count,
            timeout,
            f"{count} × {event} {fields or ''}",
        )
        return self.events(event, **fields)

    def wait_until(self, done: Callable[[], bool], timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {what}\n{self.tail()}"
                )
            if not self._fds:
                raise AssertionError(
                    f"the daemon exited ({self.proc.poll()}) while waiting for {what}\n{self.tail()}"
                )
            self.pump(min(left, 0.5))  # returns early with each line read: not a fixed pause
        return True

    def wait_status(
        self,
        run_dir: Path,
        done: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Read until ``run_dir/status.json`` (replaced atomically by the daemon) satisfies ``done``."""
        seen: list[dict[str, Any]] = []

        def check() -> bool:
            try:
                status = json.loads((run_dir / "status.json").read_text())
            except (OSError, ValueError):
                return False
            seen[:] = [status]
            return done(status)

        self.wait_until(check, timeout, f"status.json: {what}")
        return seen[0]

    def tail(self, n: int = 25) -> str:
        lines = [json.dumps(ln) for ln in self.lines[-n:]]
        return "last log lines:\n" + "\n".join(lines) + f"\nstderr:\n{self.stderr[-3000:]}"

    # -- lifecycle ---------------------------------------------------------------------------

    def ready(self, timeout: float = 30.0) -> DaemonProcess:
        self.wait_for("daemon.ready", timeout=timeout)
        return self

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``signum`` and read until the daemon exits; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 30.0) -> int:
        # stderr may stay open in an orphaned grandchild; stdout is the daemon's alone.
        out = self.proc.stdout.fileno() if self.proc.stdout else -1
        self.wait_until(lambda: out not in self._fds, timeout, "the daemon to exit")
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.drain()

    def drain(self) -> None:
        """Read what the pipes hold now (all a dead daemon wrote), without waiting for more: an
        orphaned child may keep stderr open."""
        for _ in range(1000):  # bounded: a live writer could keep a pipe ready forever
            ready, _, _ = select.select(list(self._fds), [], [], 0)
            if not ready:
                return
            for fd in ready:
                self._read(fd)

    def close(self) -> None:
        """Make sure nothing of this daemon survives the test."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in marked_processes(self.token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def check_log(self) -> None:
        """Every line is JSON with ts, level and a registered event; every job line has a job_id."""
        for line in self.lines:
            assert {"ts", "level", "event"} <= line.keys(), line
            if "logger" not in line:  # library records pass through with their own text
                assert line["event"] in EVENTS, line
            if str(line["event"]).startswith(("job.", "plan.", "attempt.")):
                assert line.get("job_id"), line


@contextlib.contextmanager
def running(config: Path, **kwargs: Any) -> Iterator[DaemonProcess]:
    """A started daemon (ready), always cleaned up; its log is checked when the block succeeds."""
    daemon = DaemonProcess(config, **kwargs)
    try:
        daemon.ready()
        yield daemon
        daemon.check_log()
    finally:
        daemon.close()


def results(outbox: Path) -> list[Path]:
    """Published results (the outbox's visible folders but duplicates' pointers)."""
    return sorted(
        p
        for p in outbox.iterdir()
        if not p.name.startswith(".") and not (p / "duplicate.json").exists()
    )


def pointers(outbox: Path) -> list[Path]:
    """The outbox folders of duplicate jobs: ``duplicate.json`` and reports naming the first result."""
    return sorted(
        p
        for p in outbox.iterdir()
        if not p.name.startswith(".") and (p / "duplicate.json").exists()
    )
