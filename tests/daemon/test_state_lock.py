"""One daemon per state_dir: a second ``sharderd run`` on the same folders refuses to start."""

from __future__ import annotations

from pathlib import Path

from daemon_helpers import DaemonProcess, running, write_config


def test_a_second_daemon_on_the_same_state_dir_exits_2_naming_the_first(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with running(config) as first:
        second = DaemonProcess(config)
        try:
            assert second.wait_exit(30) == 2
            assert (
                f"another sharderd daemon (pid {first.pid}) already runs on state_dir"
                in second.stderr
            )
            assert "Traceback" not in second.stderr
            assert not second.events("daemon.ready")
        finally:
            second.close()
        assert first.proc.poll() is None  # the first one is untouched
    third = DaemonProcess(config)  # the lock went with the first process
    try:
        third.ready()
        assert third.stop() == 0
    finally:
        third.close()
