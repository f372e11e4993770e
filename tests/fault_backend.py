"""A backend that fails on purpose, so tests can prove every way a worker breaks becomes an outcome.

It is not shipped: tests register it for the worker subprocess with :func:`worker_env` (the
registry's ``SHARDERD_EXTRA_BACKENDS`` names this module, and this folder goes on ``PYTHONPATH``),
then send requests with ``backend = "fault"``. It never reads the model.
``request.options["fault"]`` picks the misbehaviour:

- ``succeed``: an ``ok`` outcome, the control case.
- ``segfault``: a real NULL dereference (core dumps off first), so the worker dies of SIGSEGV.
- ``hang``: block forever; SIGTERM still ends it.
- ``fork_bomb``: fork ``options["children"]`` (default 20, at most 256) children that ignore SIGTERM
  and block forever, then hang: only SIGKILL of the whole group ends them.
- ``stderr_flood``: write ``options["bytes"]`` (default 100 MiB) to stderr, ending with
  ``FLOOD_END``, then succeed: the parent must keep draining and keep only a tail.
- ``exit_without_result``: exit 0 before the worker can write its result.
- ``truncated_result``: write half of an ``ok`` result to the worker's result path, then exit 0.
- ``exception``: raise ``RuntimeError`` naming the model; the worker's traceback is the evidence.

``hang`` and ``fork_bomb`` first write the pids they own, one per line, to ``PID_FILE`` in the
working directory (the attempt folder), so a test can prove none of them outlives the attempt.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, NoReturn

from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import EXTRA_BACKENDS_ENV

__all__ = [
    "FAULTS",
    "FLOOD_END",
    "PID_FILE",
    "REGISTRATION",
    "available",
    "run_attempt",
    "worker_env",
]

REGISTRATION: Final = "fault=fault_backend"
"""This module as an entry of ``SHARDERD_EXTRA_BACKENDS``."""
TESTS_DIR: Final = Path(__file__).resolve().parent

PID_FILE: Final = "fault-pids.txt"
FLOOD_END: Final = "fault backend: end of flood\n"
_DEFAULT_CHILDREN: Final = 20
_MAX_CHILDREN: Final = 256
"""A bomb with a fuse: enough to prove group cleanup, never enough to exhaust the host's pids."""
_DEFAULT_FLOOD_BYTES: Final = 100 * 1024 * 1024
_CHUNK: Final = 1 << 20


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this backend registered, for a worker subprocess (or a Ray node) to run it."""
    extra = ",".join(filter(None, [env.get(EXTRA_BACKENDS_ENV), REGISTRATION]))
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    return {**env, EXTRA_BACKENDS_ENV: extra, "PYTHONPATH": path}


def available() -> bool:
    """Always: it needs nothing but the standard library."""
    return True


def run_attempt(request: AttemptRequest) -> AttemptOutcome:
    """Misbehave as ``request.options["fault"]`` says (``succeed`` when unset)."""
    fault = request.options.get("fault", "succeed")
    action = FAULTS.get(fault)
    if action is None:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(sorted(FAULTS))})")
    return action(request)


def _succeed(request: AttemptRequest) -> AttemptOutcome:
    return AttemptOutcome(
        "ok", f"fault backend: nothing injected for {request.model}", artifact=request.artifact
    )


def _segfault(request: AttemptRequest) -> NoReturn:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a test must not litter the folder with cores
    _say(f"segfault for {request.model}")
    ctypes.string_at(0)
    os.kill(os.getpid(), signal.SIGSEGV)  # pragma: no cover - only where address 0 is mapped
    raise AssertionError("unreachable")  # pragma: no cover


def _hang(request: AttemptRequest) -> NoReturn:
    _write_pids([os.getpid()])
    _say(f"hanging for {request.model}")
    _block_forever()


def _fork_bomb(request: AttemptRequest) -> NoReturn:
    count = _bounded_int(request.options, "children", _DEFAULT_CHILDREN, _MAX_CHILDREN)
    # Ignoring SIGTERM before forking means no child can be caught in the window before it would
    # install the handler itself; the leader then restores the default so SIGTERM ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                _block_forever()
            finally:
                os._exit(0)  # never return into the worker
        children.append(pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _write_pids([os.getpid(), *children])
    _say(f"forked {count} children that ignore SIGTERM; hanging for {request.model}")
    _block_forever()


def _stderr_flood(request: AttemptRequest) -> AttemptOutcome:
    total = _bounded_int(request.options, "bytes", _DEFAULT_FLOOD_BYTES, 1 << 34)
    sys.stderr.flush()
    line = b"fault backend: flooding stderr " + b"x" * 97 + b"\n"
    chunk = line * (_CHUNK // len(line))
    written = 0
    while written < total:
        written += _write_all(2, chunk[: total - written])
    _write_all(2, FLOOD_END.encode())
    return AttemptOutcome(
        "ok", f"fault backend: wrote {written} bytes to stderr", artifact=request.artifact
    )


def _exit_without_result(request: AttemptRequest) -> NoReturn:
    _say(f"exiting 0 without a result for {request.model}")
    os._exit(0)


def _truncated_result(request: AttemptRequest) -> NoReturn:
    if len(sys.argv) != 3:
        raise RuntimeError(
            "truncated_result runs under `python -m sharderd.backends.worker REQUEST RESULT`"
        )
    whole = json.dumps(_succeed(request).to_json(), sort_keys=True)
    Path(sys.argv[2]).write_text(whole[: len(whole) // 2], encoding="utf-8")
    _say(f"wrote a truncated result for {request.model}")
    os._exit(0)


def _exception(request: AttemptRequest) -> NoReturn:
    raise RuntimeError(f"fault backend: injected failure for {request.model}")


FAULTS: Mapping[str, Callable[[AttemptRequest], AttemptOutcome]] = {
    "succeed": _succeed,
    "segfault": _segfault,
    "hang": _hang,
    "fork_bomb": _fork_bomb,
    "stderr_flood": _stderr_flood,
    "exit_without_result": _exit_without_result,
    "truncated_result": _truncated_result,
    "exception": _exception,
}
"""Every fault by name, as ``options["fault"]`` selects it."""


def _say(message: str) -> None:
    print(f"fault backend: {message}", file=sys.stderr, flush=True)


def _block_forever() -> NoReturn:
    """Wait for signals without ever finishing: only a signal that is not ignored ends this."""
    while True:
        signal.pause()


def _write_pids(pids: list[int]) -> None:
    Path(PID_FILE).write_text("".join(f"{pid}\n" for pid in pids), encoding="ascii")


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _bounded_int(options: Mapping[str, Any], key: str, default: int, limit: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"fault option {key!r} must be an integer in 0..{limit}, got {value!r}")
    return value
