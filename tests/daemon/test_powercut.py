"""Power cuts through a real ``sharderd run`` (``tests/powercut.py``): one traced run of a model from
a fresh state folder, then, for each window a cut could fall in, the tree that cut leaves is built
and a new daemon started on it; then the same bytes are dropped again under another name.

After each cut and restart: the model is not lost (in ``done/``, not ``lost+found/``), its content
is published once (the second drop is a duplicate of it: the content index survived), and every
report copied into ``done/`` is whole.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DaemonProcess, drop, pointers, results, running, staged, write_config
from powercut import cuts, drop_traced, load_trace, materialize, traced

from sharderd.fsutil import fsync_dir

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

Trace = list[dict[str, Any]]


def _drop_durably(src: Path, inbox: Path, name: str | None = None) -> None:
    drop(src, inbox, name)
    fsync_dir(inbox)


def traced_run(root: Path) -> tuple[Trace, Path, bytes]:
    """One model through a daemon started on a fresh root, traced; the final tree moved to
    ``<root>.final``. Returns the trace, the final tree and the model's bytes."""
    config = write_config(root)
    model = staged(root, "a")
    data = model.read_bytes()
    daemon = DaemonProcess(config, env=traced(root))
    try:
        daemon.ready()
        drop_traced(model, root / "inbox" / model.name)
        daemon.wait_for("job.succeeded", timeout=120)
        assert daemon.stop() == 0
    finally:
        daemon.close()
    final = root.with_name(f"{root.name}.final")
    root.rename(final)
    return load_trace(root), final, data


def _after(trace: Trace, found: Callable[[dict[str, Any]], bool], then: str | None = None) -> int:
    """The cut just after the first op ``found`` selects (or, with ``then``, after the next fsync
    of the folder ``then`` that follows it)."""
    start = next(k for k, op in enumerate(trace) if found(op))
    if then is None:
        return start + 1
    return next(
        k + 1
        for k, op in enumerate(trace[start:], start)
        if op["op"] == "fsync" and op["path"] == then
    )


def windows(trace: Trace, root: Path) -> dict[str, int]:
    """The cut points of the windows issue 37 names, found in the trace by what they do."""
    inbox, outbox = str(root / "inbox"), str(root / "outbox")

    def claim(op: dict[str, Any]) -> bool:
        return op["op"] == "rename" and op["src"] == f"{inbox}/a.onnx" and "processing" in op["dst"]

    def publish(op: dict[str, Any]) -> bool:
        return op["op"] == "rename" and str(Path(op["dst"]).parent) == outbox

    def mark(what: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
        return lambda op: (
            op["op"] == "mark"
            and op["what"] == what
            and all(op.get(k) == v for k, v in fields.items())
        )

    return {
        # the inbox's loss of the model is durable; is the folder it went to? (claim, start-up)
        "claimed": _after(trace, claim, then=inbox),
        "published": _after(trace, publish, then=outbox),
        "remembered": _after(trace, mark("remembered")) - 1,
        "succeeded": _after(trace, mark("recorded", state="succeeded")) - 1,
        # everything done: are the report copies in done/ whole?
        "end": len(trace),
    }


def check_after_cut(root: Path, data: bytes, lost: list[Path], *, timeout: float = 120) -> None:
    """Restart on the cut's tree, drop the same bytes as ``again``: nothing lost, done once.

    A cut before the first drop leaves the model in ``models/``: it is dropped again first, as its
    writer would (its rename never happened)."""
    digest = hashlib.sha256(data).hexdigest()
    assert not [p for p in lost if hashlib.sha256(p.read_bytes()).hexdigest() == digest], (
        "the model is only in lost+found"
    )
    again = root / "models" / "again.onnx"
    again.write_bytes(data)
    with running(write_config(root)) as daemon:
        if (root / "models" / "a.onnx").exists():
            _drop_durably(root / "models" / "a.onnx", root / "inbox")
        _drop_durably(again, root / "inbox")
        daemon.wait_until(
            lambda: bool(daemon.events("job.duplicate")),
            timeout,
            "one of the two drops to be a duplicate",
        )
        daemon.wait_until(
            lambda: (
                not any((root / "state" / "processing").iterdir())
                and not any((root / "inbox").iterdir())
            ),
            timeout,
            "every job to end",
        )
    assert len(results(root / "outbox")) == 1 and len(pointers(root / "outbox")) == 1
    done = root / "state" / "done"
    kept = [p for p in done.rglob("*.onnx") if p.read_bytes() == data]
    assert len(kept) == 1 and kept[0].parent.name in ("a", "again"), kept
    for report in done.rglob("report.json"):
        json.loads(report.read_text())  # whole: a copy never fsynced would be empty


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Trace, Path, bytes]]:
    root = tmp_path_factory.mktemp("powercut") / "root"
    (root / "models").mkdir(parents=True)
    yield traced_run(root)


def check_cut_state(root: Path, data: bytes, lost: list[Path]) -> None:
    """What a cut leaves, before any restart: the model is somewhere a restart finds it (inbox,
    processing/, done/; models/ before the drop), every journal record is whole, a ``succeeded`` one has its content in the
    index, and every file in ``done/`` and the outbox's results is whole."""
    state = root / "state"
    homes = [root / "models", root / "inbox", state / "processing", state / "done"]
    found = [p for home in homes if home.is_dir() for p in home.rglob("*.onnx")]
    assert any(p.read_bytes() == data for p in found), ("model lost", found, lost)
    indexed = (
        {p.stem for p in (state / "index").glob("*.json")} if (state / "index").is_dir() else set()
    )
    for path in (state / "journal").glob("*.json") if (state / "journal").is_dir() else ():
        record = json.loads(path.read_text())
        if record["state"] == "succeeded":
            assert record["sha256"] in indexed, "the index is behind a succeeded record"
    for folder in (state / "done", root / "outbox"):
        for report in folder.glob("[!.]*/report.json") if folder.is_dir() else ():
            json.loads(report.read_text())


def test_every_cut_leaves_a_state_a_restart_can_finish(
    run: tuple[Trace, Path, bytes],
) -> None:
    """At every point of the run (each operation that changes what survives), the tree a cut
    leaves keeps the model, the index is not behind a ``succeeded`` record, reports are whole."""
    trace, final, data = run
    root = final.with_name("root")
    points = list(cuts(trace))
    assert len(points) > 50
    for k in points:
        shutil.rmtree(root, ignore_errors=True)
        try:
            check_cut_state(root, data, materialize(trace, k, final, root))
        except AssertionError as exc:
            raise AssertionError(
                f"cut after {k} of {len(trace)} ops ({trace[k - 1]}): {exc}"
            ) from None


@pytest.mark.parametrize("window", ["claimed", "published", "remembered", "succeeded", "end"])
def test_a_cut_in_each_window_loses_nothing_and_does_nothing_twice(
    run: tuple[Trace, Path, bytes], window: str, tmp_path: Path
) -> None:
    trace, final, data = run
    root = final.with_name("root")
    cut = windows(trace, root)[window]
    shutil.rmtree(root, ignore_errors=True)
    lost = materialize(trace, cut, final, root)
    check_after_cut(root, data, lost)
