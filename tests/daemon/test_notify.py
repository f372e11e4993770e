"""sharderd.daemon.notify against real AF_UNIX datagram sockets."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sharderd.childenv import child_env
from sharderd.daemon.notify import Notifier, watchdog_interval


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    sock.bind(address)
    sock.settimeout(5)
    yield address, sock
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"sharderd-test-{secrets.token_hex(6)}"
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield "@" + name, sock
    sock.close()


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_path_socket_receives_every_message(path_socket: tuple[str, socket.socket]) -> None:
    """READY, STATUS, WATCHDOG, EXTEND_TIMEOUT_USEC and STOPPING arrive as sd_notify lines."""
    address, sock = path_socket
    notifier = Notifier(address)
    assert notifier.ready("watching /inbox")
    assert notifier.status("3 pending\n1 running")
    assert notifier.watchdog()
    assert notifier.extend_timeout(30_000_000)
    assert notifier.stopping()
    assert [recv(sock) for _ in range(5)] == [
        "READY=1\nSTATUS=watching /inbox",
        "STATUS=3 pending 1 running",
        "WATCHDOG=1",
        "EXTEND_TIMEOUT_USEC=30000000",
        "STOPPING=1",
    ]
    notifier.close()


def test_abstract_socket_from_environment(
    abstract_socket: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NOTIFY_SOCKET=@name`` addresses the abstract namespace."""
    address, sock = abstract_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert Notifier().ready()
    assert recv(sock) == "READY=1"


def test_unset_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``NOTIFY_SOCKET`` every call returns False and nothing is logged."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    with capture_logs() as logs:
        assert not notifier.enabled
        assert [notifier.ready(), notifier.watchdog(), notifier.stopping()] == [False, False, False]
    assert logs == []


def test_failed_send_logs_once(tmp_path: Path) -> None:
    """A socket that is gone makes sends return False and logs ``notify.failed`` once."""
    notifier = Notifier(str(tmp_path / "missing.sock"))
    with capture_logs() as logs:
        assert not notifier.watchdog()
        assert not notifier.watchdog()
    assert [entry["event"] for entry in logs] == ["notify.failed"]
    assert logs[0]["socket"].endswith("missing.sock")


def test_full_queue_does_not_block(path_socket: tuple[str, socket.socket]) -> None:
    """When the receiver stops reading, a send fails at once instead of blocking the event loop."""
    address, _sock = path_socket
    notifier = Notifier(address)
    with capture_logs() as logs:
        sent = 0
        while sent < 100_000 and notifier.watchdog():
            sent += 1
        assert not notifier.watchdog()  # still failing, still not blocking, not logged again
    assert 0 < sent < 100_000
    assert [entry["event"] for entry in logs] == ["notify.failed"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "20000000"}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}, 10.0),
        ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    """Half of WATCHDOG_USEC in seconds, unless unset, invalid or addressed to another pid."""
    assert watchdog_interval(env) == expected


def test_child_env_strips_systemd_variables() -> None:
    """An attempt subprocess started with ``child_env`` sees no NOTIFY_SOCKET / WATCHDOG_*."""
    env = {
        **os.environ,
        "NOTIFY_SOCKET": "@x",
        "WATCHDOG_USEC": "1",
        "WATCHDOG_PID": "1",
        "KEEP": "yes",
    }
    script = "import os, json; print(json.dumps(sorted(k for k in os.environ if k in {'NOTIFY_SOCKET', 'WATCHDOG_USEC', 'WATCHDOG_PID', 'KEEP'})))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env(env),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == '["KEEP"]'
