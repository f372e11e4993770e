"""What a job dropped by someone else can make the daemon do: nothing outside its folders.

The tests run the daemon's service in their own event loop (``tests/daemon_served.py``), the root
refusal a real ``sharderd run`` process (``tests/daemon_helpers.py``). "Never read" is
checked with inotify, not trust: decoy files and folders outside the daemon's folders are watched
for ``IN_OPEN`` and ``IN_ACCESS`` while the daemon handles jobs that point at them, and an open
through a symlink or a hard link reports on the decoy too. Only this test knows the decoys' paths,
so any event is the daemon's doing. ``/etc`` itself is compared by ``lstat`` before and after.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from daemon_helpers import (
    DaemonProcess,
    chain_model,
    drop,
    results,
    running,
    save_model,
    write_config,
)
from daemon_served import serving

from sharderd.filenames import safe_name

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

_IN_ACCESS = 0x001
_IN_OPEN = 0x020
_EVENT = struct.Struct("iIII")


class OpenWatch:
    """inotify ``IN_OPEN | IN_ACCESS`` on some paths; ``events()`` lists what happened to them."""

    def __init__(self, paths: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.paths: dict[int, Path] = {}
        for path in paths:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), _IN_OPEN | _IN_ACCESS)
            assert wd >= 0, (path, os.strerror(ctypes.get_errno()))
            self.paths[wd] = path

    def events(self) -> list[tuple[str, str]]:
        """``(watched path, "open"/"access" [+ " name"])`` of every event so far."""
        found = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                name = (
                    data[offset + _EVENT.size : offset + _EVENT.size + size].rstrip(b"\0").decode()
                )
                offset += _EVENT.size + size
                kind = "open" if mask & _IN_OPEN else "access"
                found.append((str(self.paths.get(wd, wd)), f"{kind} {name}".strip()))

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def open_watch() -> Iterator[list[OpenWatch]]:
    watches: list[OpenWatch] = []
    yield watches
    for watch in watches:
        watch.close()


def lstat_tree(folder: Path) -> dict[str, tuple[int, ...]]:
    """``lstat`` of ``folder`` and its direct entries: what a write, rename or chmod would change."""

    def key(st: os.stat_result) -> tuple[int, ...]:
        return st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino

    tree = {".": key(os.lstat(folder))}
    for entry in os.scandir(folder):
        tree[entry.name] = key(entry.stat(follow_symlinks=False))
    return tree


def errors_by_name(root: Path) -> dict[str, dict[str, object]]:
    failed = root / "state" / "failed"
    return {p.name: json.loads((p / "error.json").read_text()) for p in failed.iterdir()}


# --- links ---------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("watch_mode", ["inotify", "poll"])
async def test_symlinks_dropped_in_the_inbox_fail_and_are_never_followed(
    tmp_path: Path, open_watch: list[OpenWatch], watch_mode: str
) -> None:
    """Links to /etc, /etc/passwd and to valid models outside fail as bad jobs (the link kept in
    failed/), a link that is no job stays untouched, and nothing they point at is opened or changed,
    neither by the watcher (inotify or polling) nor by the jobs."""
    outside = tmp_path / "outside"
    decoy = save_model(chain_model(1), outside / "decoy.onnx")
    decoy_dir = save_model(chain_model(2), outside / "net" / "net.onnx").parent
    (outside / "side.toml").write_text("priority = 3\n")
    root = tmp_path / "daemon"
    inbox = root / "inbox"
    inbox.mkdir(parents=True)
    links = {
        "etc": Path("/etc"),
        "passwd.onnx": Path("/etc/passwd"),
        "decoy.onnx": decoy,
        "decoydir": decoy_dir,
        "notes.txt": Path("/etc/passwd"),
    }
    for name, target in links.items():
        (inbox / name).symlink_to(target)
    (inbox / "inner").mkdir()
    (inbox / "inner" / "net.onnx").symlink_to(decoy)  # a folder job whose model is a link
    save_model(chain_model(3), inbox / "side.onnx")
    (inbox / "side.toml").symlink_to(outside / "side.toml")  # a real model whose sidecar is a link
    good = save_model(chain_model(4), tmp_path / "good.onnx")
    etc_before, passwd_before = lstat_tree(Path("/etc")), Path("/etc/passwd").stat()
    watch = OpenWatch(
        [outside, outside / "decoy.onnx", decoy_dir, decoy_dir / "net.onnx", outside / "side.toml"]
    )
    open_watch.append(watch)
    async with serving(write_config(root, watch_mode=watch_mode, poll_interval=0.3)) as daemon:
        await daemon.wait_for("job.failed", count=6)
        drop(good, inbox)
        await daemon.wait_for("job.succeeded", name="good")  # the daemon keeps serving
    assert watch.events() == []
    assert lstat_tree(Path("/etc")) == etc_before and Path("/etc/passwd").stat() == passwd_before
    errors = errors_by_name(root)
    assert sorted(errors) == ["decoy", "decoydir", "etc", "inner", "passwd", "side"]
    for name, error in errors.items():
        assert error["reason"] == "bad_job" and "symbolic link" in str(error["message"]), (
            name,
            error,
        )
    failed = root / "state" / "failed"
    assert (failed / "etc" / "etc").readlink() == Path(
        "/etc"
    )  # the link itself moved, never what it names
    assert (failed / "passwd" / "passwd.onnx").readlink() == Path("/etc/passwd")
    assert (failed / "side" / "side.toml").readlink() == outside / "side.toml"
    assert [p.name for p in inbox.iterdir()] == ["notes.txt"] and (inbox / "notes.txt").is_symlink()
    assert [p.name for p in results(root / "outbox")] == ["good"]


def _external_job(folder: Path, seed: int) -> tuple[Path, Path]:
    """A folder job ``net.onnx`` + ``net.data`` (its weights); returns both paths."""
    model = save_model(chain_model(seed, hidden=32), folder / "net.onnx", external_data=True)
    return model, folder / "net.data"


def _relocate(model: Path, location: str) -> None:
    """Point every external tensor of ``model`` at ``location``."""
    proto = onnx.load(str(model), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(proto, str(model))


@pytest.mark.anyio
async def test_external_data_outside_the_job_folder_is_never_read(
    tmp_path: Path, open_watch: list[OpenWatch]
) -> None:
    """External data named by absolute path, by ``..``, through a symlink or as a hard link to a file
    outside fails the job with a message saying why; the outside files are never opened."""
    outside = tmp_path / "outside"
    outside.mkdir()
    staging = tmp_path / "staging"
    model, data = _external_job(staging / "absolute", 1)
    data.rename(outside / "absolute.bin")
    _relocate(model, str(outside / "absolute.bin"))
    model, data = _external_job(staging / "dotdot", 2)
    data.rename(outside / "dotdot.bin")
    _relocate(model, "../../../../outside/dotdot.bin")
    model, data = _external_job(staging / "symlinked", 3)
    data.rename(outside / "symlinked.bin")
    data.symlink_to(outside / "symlinked.bin")
    model, data = _external_job(staging / "hardlinked", 4)
    data.rename(outside / "hardlinked.bin")
    os.link(outside / "hardlinked.bin", data)
    secrets = sorted(outside.iterdir())
    watch = OpenWatch([outside, *secrets])
    open_watch.append(watch)
    root = tmp_path / "daemon"
    async with serving(write_config(root)) as daemon:
        for job in sorted(staging.iterdir()):
            drop(job, root / "inbox")
        await daemon.wait_for("job.failed", count=4)
    assert watch.events() == []
    errors = errors_by_name(root)
    expect = {
        "absolute": "is absolute",
        "dotdot": "contains '..'",
        "symlinked": "outside the model's folder",
        "hardlinked": "is a hard link",
    }
    assert sorted(errors) == sorted(expect)
    for name, fragment in expect.items():
        assert fragment in str(errors[name]["message"]), (name, errors[name])
        assert errors[name]["reason"] in ("bad_model", "bad_job"), errors[name]
    assert results(root / "outbox") == []
    assert (
        root / "state" / "failed" / "hardlinked" / "hardlinked" / "net.data"
    ).stat().st_nlink == 2  # kept, not copied


# --- modes, root, execution ------------------------------------------------------------------------


def _modes(folder: Path) -> set[tuple[str, int]]:
    """``("d" | "f", permission bits)`` of ``folder`` and everything below it."""
    found = {("d", stat.S_IMODE(folder.stat().st_mode))}
    for path in folder.rglob("*"):
        found.add(("d" if path.is_dir() else "f", stat.S_IMODE(path.lstat().st_mode)))
    return found


async def _run_with_umask_0(config: Path, root: Path) -> None:
    """One good and one bad job through the daemon under umask 0 (so no mode comes from the umask)."""
    save_model(chain_model(1, hidden=32), root / "models" / "good" / "net.onnx", external_data=True)
    (root / "models" / "bad.onnx").write_text("not a model\n")
    old = os.umask(0)
    try:
        async with serving(config) as daemon:
            drop(root / "models" / "good", root / "inbox")
            drop(root / "models" / "bad.onnx", root / "inbox")
            await daemon.wait_for("job.succeeded")
            await daemon.wait_for("job.failed")
    finally:
        os.umask(old)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("configured", "file_mode", "dir_mode"), [(False, 0o640, 0o750), (True, 0o600, 0o700)]
)
async def test_results_and_failures_get_the_configured_modes(
    tmp_path: Path, configured: bool, file_mode: int, dir_mode: int
) -> None:
    """Every file and folder of a result, and what sharderd writes into failed/, has ``file_mode`` /
    ``dir_mode`` (default 0640/0750), even when the daemon's umask would allow more."""
    root = tmp_path / "daemon"
    modes = {"file_mode": file_mode, "dir_mode": dir_mode} if configured else {}
    await _run_with_umask_0(write_config(root, **modes), root)
    result = root / "outbox" / "good"
    assert (result / "net.sharded.onnx").is_file()
    assert _modes(result) == {("d", dir_mode), ("f", file_mode)}
    failed = root / "state" / "failed" / "bad"
    written = {
        p.name: stat.S_IMODE(p.stat().st_mode)
        for p in failed.iterdir()
        if p.name.startswith("error.")
    }
    assert written == {"error.json": file_mode, "error.md": file_mode}
    assert stat.S_IMODE(failed.stat().st_mode) == dir_mode


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to check the refusal")
def test_refuses_root_unless_allow_root_then_starts(tmp_path: Path) -> None:
    """As root without ``allow_root`` it exits 2 with the reason before touching any folder; with
    ``allow_root = true`` it starts and serves."""
    root = tmp_path / "daemon"
    refused = DaemonProcess(write_config(root, allow_root=False))
    try:
        assert refused.wait_exit(30) == 2
        assert "refusing to run as root" in refused.stderr and "allow_root = true" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        refused.close()
    assert sorted(p.name for p in root.iterdir()) == ["sharderd.toml"]  # no folder created
    with running(write_config(root, allow_root=True)) as daemon:
        drop(save_model(chain_model(1), tmp_path / "m.onnx"), root / "inbox")
        daemon.wait_for("job.succeeded", name="m")
        assert daemon.stop() == 0


SHELLY = [
    "$(touch ${SHARDERD_PWNED})",
    "`touch ${SHARDERD_PWNED}`",
    "x; touch ${SHARDERD_PWNED} #",
    "--help",
    "two\nlines | touch ${SHARDERD_PWNED}",
]
"""Job names a shell would run; ``$SHARDERD_PWNED`` is set in the daemon's environment, so a shell
started anywhere below it (worker, attempt, compiler) would create that file."""


@pytest.mark.anyio
async def test_nothing_from_a_job_is_executed(tmp_path: Path) -> None:
    """Names, graph strings and sidecar values that are shell commands stay data: the jobs run (or
    fail on the bad value, quoting it), the compiler gets them as arguments, and no shell ever runs."""
    pwned = tmp_path / "pwned"
    root = tmp_path / "daemon"
    models = root / "models"
    for k, name in enumerate(SHELLY):
        model = chain_model(10 + k)
        model.graph.name = model.doc_string = model.producer_name = name
        model.graph.node[0].name = f"{name}/node"
        save_model(model, models / f"{name}.onnx")
    (models / f"{SHELLY[0]}.toml").write_text(
        'backend = "poprt"\n'
    )  # its compile attempts get the name as argv
    save_model(chain_model(20), models / "tick.onnx")
    (models / "tick.toml").write_text('target = "`touch ${SHARDERD_PWNED}`"\n')
    save_model(chain_model(21), models / "dollar.onnx")
    (models / "dollar.toml").write_text('backend = "$(touch ${SHARDERD_PWNED})"\n')
    env = {"SHARDERD_PWNED": str(pwned), "FAKE_POPRT_COMPILE_SECONDS": "0"}
    async with serving(write_config(root, target="ipu-mk2"), env=env, fake_poprt=True) as daemon:
        for path in sorted(models.iterdir(), key=lambda p: p.suffix != ".toml"):  # sidecars first
            drop(path, root / "inbox")
        await daemon.wait_for("job.succeeded", count=len(SHELLY), timeout=60)
        await daemon.wait_for("job.failed", count=2)
        assert daemon.events(
            "attempt.started",
        ) and daemon.events("attempt.finished", result="ok")
    assert not pwned.exists() and not list(tmp_path.rglob("pwned"))
    # a newline is not printable: that job's outbox folder is named %0A (filenames.safe_name)
    assert sorted(p.name for p in results(root / "outbox")) == sorted(map(safe_name, SHELLY))
    assert list((root / "outbox" / SHELLY[0]).glob("*.popef"))
    errors = errors_by_name(root)
    assert sorted(errors) == ["dollar", "tick"]
    assert all(e["reason"] == "bad_config" for e in errors.values())
    assert "`touch ${SHARDERD_PWNED}`" in str(errors["tick"]["message"])
    assert (
        "$(touch ${SHARDERD_PWNED})"
        in (root / "state" / "failed" / "dollar" / "error.md").read_text()
    )
    report = json.loads((root / "outbox" / SHELLY[1] / "report.json").read_text())
    assert SHELLY[1] in json.dumps(report)  # the name is in the report, as text
