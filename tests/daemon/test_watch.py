"""daemon/watch.py in process: the watcher is ready only once it watches, and says what changed."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from sharderd.config import DaemonConfig
from sharderd.daemon.watch import InboxEvents, InboxWatcher, watch_mode


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _watcher(inbox: Path, watch: str) -> tuple[InboxWatcher, InboxEvents]:
    daemon = DaemonConfig(inbox=inbox, watch_mode=watch, poll_interval=0.05)  # type: ignore[arg-type]
    events = InboxEvents()
    mode, polling = watch_mode(daemon)
    return InboxWatcher(daemon, events, mode=mode, force_polling=polling), events


@pytest.mark.anyio
async def test_a_rename_right_after_start_is_reported(tmp_path: Path) -> None:
    """``tg.start`` returns once the kernel watch exists: a rename made at once is not missed."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watcher, events = _watcher(inbox, "inotify")
    staged = inbox / ".m.onnx.part"
    staged.write_bytes(b"x")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(watcher.run)
            staged.rename(inbox / "m.onnx")
            dirty: set[Path] = set()
            renamed: frozenset[Path] = frozenset()
            while inbox / "m.onnx" not in renamed:
                more, renamed_now, _ = await events.wait(float("inf"))
                dirty |= more
                renamed |= renamed_now
            watcher.stop()
            tg.cancel_scope.cancel()
    assert inbox / "m.onnx" in dirty


@pytest.mark.anyio
async def test_polling_asks_for_a_full_scan_every_poll(tmp_path: Path) -> None:
    """Polling has no events (network filesystems): every ``poll_interval`` it asks for a scan."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watcher, events = _watcher(inbox, "poll")
    assert watcher.mode == "poll"
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(watcher.run)
            for _ in range(2):
                assert (await events.wait(float("inf")))[2]
            watcher.stop()
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_file_written_in_place_under_any_name_is_reported_not_as_renamed(
    tmp_path: Path,
) -> None:
    """A latin-1 name written in place is dirty (to settle), not renamed; the watch goes on (with
    watchfiles it stopped: "Unable to decode path")."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watcher, events = _watcher(inbox, "inotify")
    path = inbox / os.fsdecode(b"\xe9t\xe9.onnx")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(watcher.run)
            path.write_bytes(b"x")
            dirty, renamed, _ = await events.wait(float("inf"))
            (inbox / ".b.onnx.part").write_bytes(b"y")
            (inbox / ".b.onnx.part").rename(inbox / "b.onnx")
            more, renamed_now, _ = await events.wait(float("inf"))
            watcher.stop()
            tg.cancel_scope.cancel()
    assert path in dirty and path not in renamed
    assert renamed_now == {inbox / "b.onnx"} and inbox / "b.onnx" in more
