"""The daemon's service in the test's own event loop (``tests/daemon_served.py``): intake, claims,
the queue, the journal, filing and recovery, on temporary folders.

Backend ``none`` (plan only) unless a test needs compile attempts, which the fake poprt
(``tests/fake_poprt``) provides. What only a real process shows (signals, kill -9, systemd, exit
codes) is in ``test_daemon_process.py``. Tests marked ``slow`` run only with ``SHARDERD_SLOW=1``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import anyio
import onnx
import pytest
from daemon_helpers import (
    chain_model,
    drop,
    planworker_hook,
    results,
    save_model,
    staged,
    ts,
    write_config,
)
from daemon_served import Served, serving

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

run_slow = pytest.mark.skipif(
    not os.environ.get("SHARDERD_SLOW"), reason="slow; set SHARDERD_SLOW=1 to run"
)


def outcome_names(daemon: Served, event: str) -> list[str]:
    return sorted(line["name"] for line in daemon.events(event))


# --- intake -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_slow_in_place_copy_is_claimed_once_after_it_is_complete(root: Path) -> None:
    """A model written into the inbox in chunks with pauses is claimed once, after the last write."""
    data = staged(root, "slow").read_bytes()
    async with serving(write_config(root)) as daemon:
        target = root / "inbox" / "slow.onnx"
        chunks = 8
        with open(target, "wb") as f:
            for k in range(chunks):
                f.write(data[k * len(data) // chunks : (k + 1) * len(data) // chunks])
                f.flush()
                # the test's input, a slow writer: pauses shorter than settle_seconds (0.5), so
                # the file never looks complete while it is written
                await anyio.sleep(0.25)
        last_write = target.stat().st_mtime
        done = await daemon.wait_for("job.succeeded", name="slow")
        claimed = daemon.events("job.claimed", name="slow")
        assert len(claimed) == 1
        assert (
            ts(daemon.events("job.detected", name="slow")[0]) < last_write - 1.0
        )  # seen while written
        assert ts(claimed[0]) >= last_write + 0.5 - 0.05  # ...but claimed only once settled
        assert done[0]["job_id"] == claimed[0]["job_id"]
    assert (root / "state" / "done" / "slow" / "slow.onnx").read_bytes() == data
    assert (root / "state" / "done" / "slow" / "report.json").read_bytes() == (
        root / "outbox" / "slow" / "report.json"
    ).read_bytes()
    assert [p.name for p in results(root / "outbox")] == ["slow"]


@pytest.mark.anyio
async def test_part_file_renamed_in_is_exactly_one_job_and_staging_names_none(root: Path) -> None:
    """Staging names never become jobs; a ``.part`` renamed to ``.onnx`` is one job, claimed fast."""
    inbox = root / "inbox"
    inbox.mkdir()
    model = staged(root, "m").read_bytes()
    sentinel = staged(root, "sentinel", seed=1)  # written now, renamed in later: the fast path
    for name in ("x.onnx.part", "y.onnx.tmp", "z.onnx~", ".hidden.onnx"):
        (inbox / name).write_bytes(model)
    async with serving(write_config(root, settle_seconds=2.0)) as daemon:
        part = inbox / ".m.onnx.part"
        part.write_bytes(model)
        await anyio.sleep(0.2)  # the test's input: the writer pauses before its rename
        part.rename(inbox / "m.onnx")
        renamed = (inbox / "m.onnx").stat().st_ctime
        await daemon.wait_for("job.succeeded", name="m")
        sentinel = drop(sentinel, inbox)
        await daemon.wait_for("job.succeeded", name="sentinel")
        assert [ln["name"] for ln in daemon.events("job.detected")] == ["m", "sentinel"]
        claimed = daemon.events("job.claimed", name="m")
        assert len(claimed) == 1
        assert ts(claimed[0]) - renamed < 1.5  # the rename fast path, not the 2 s settle window
    assert sorted(p.name for p in inbox.iterdir()) == [
        ".hidden.onnx",
        "x.onnx.part",
        "y.onnx.tmp",
        "z.onnx~",
    ]
    assert not sentinel.exists()


@pytest.mark.anyio
async def test_folder_job_with_external_data_and_sidecar(root: Path) -> None:
    """A folder renamed in is one job: external data loaded, its sidecar applied, nothing inside a job."""
    folder = root / "models" / "big"
    save_model(chain_model(3, hidden=32), folder / "net.onnx", external_data=True)
    (folder / "sharderd.toml").write_text("devices = 3\npriority = 5\n")
    assert (folder / "net.data").stat().st_size > 10_000
    async with serving(write_config(root)) as daemon:
        drop(folder, root / "inbox")
        await daemon.wait_for("job.succeeded", name="big")
        assert len(daemon.events("job.detected")) == 1
        assert daemon.events("job.claimed")[0]["priority"] == 5
    out = root / "outbox" / "big"
    report = json.loads((out / "report.json").read_text())
    assert (
        report["model"]["external_bytes"]
        == (root / "state" / "done" / "big" / "big" / "net.data").stat().st_size
    )
    assert len(report["plan"]["stages"]) == 3
    sharded = onnx.load(str(out / "net.sharded.onnx"))  # loads its external data from the outbox
    assert (
        sum(len(t.raw_data) for t in sharded.graph.initializer) >= report["model"]["external_bytes"]
    )


@pytest.mark.anyio
async def test_bad_inputs_land_in_failed_with_a_readable_reason(root: Path) -> None:
    """Corrupt, non-ONNX, unnamed-node and escaping-data jobs fail readably; a good job still finishes."""
    models = root / "models"
    good = staged(root, "good", seed=1)
    corrupt = models / "corrupt.onnx"
    corrupt.write_bytes(staged(root, "tmp", seed=2).read_bytes()[:-200])
    text = models / "text.onnx"
    text.write_text("this is a README, not a model\n" * 20)
    unnamed = staged(root, "unnamed", seed=3, name_nodes=False)
    escape = models / "escape"
    save_model(chain_model(4, hidden=32), escape / "net.onnx", external_data=True)
    proto = onnx.load(str(escape / "net.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../secret.bin"
    onnx.save(proto, str(escape / "net.onnx"))
    (root / "inbox").mkdir()
    (root / "inbox" / "secret.bin").write_bytes(b"\0" * 100_000)  # what the model would read
    sidecar = staged(root, "typo", seed=5)
    (models / "typo.toml").write_text("devicez = 2\n")
    async with serving(write_config(root)) as daemon:
        for path in (
            corrupt,
            text,
            unnamed,
            escape,
            typo_toml := models / "typo.toml",
            sidecar,
            good,
        ):
            drop(path, root / "inbox")
        await daemon.wait_for("job.failed", count=5)
        await daemon.wait_for("job.succeeded", name="good")
        assert outcome_names(daemon, "job.failed") == [
            "corrupt",
            "escape",
            "text",
            "typo",
            "unnamed",
        ]
    assert not typo_toml.exists()
    failed = root / "state" / "failed"
    expect = {
        "corrupt": "looks incomplete",
        "text": "is not an ONNX model",
        "unnamed": "non-empty name",
        "escape": "'../secret.bin' contains '..'",
        "typo": "unknown key 'devicez'",
    }
    for name, needle in expect.items():
        error = json.loads((failed / name / "error.json").read_text())
        readable = (failed / name / "error.md").read_text()
        assert error["reason"] in {"bad_model", "bad_config"}, (name, error)
        assert needle in readable, (name, readable)
        assert "What to do" in readable
    assert (failed / "corrupt" / "corrupt.onnx").exists()  # the input is kept beside the reason
    assert [p.name for p in results(root / "outbox")] == ["good"]


@pytest.mark.anyio
async def test_same_content_twice_is_sharded_once(root: Path) -> None:
    """Two names with the same bytes and options: one result, the other a duplicate pointing at it;
    ``done/`` keeps the bytes once (the duplicate's folder holds its reports), with ``file_mode``."""
    first = staged(root, "first", seed=7)
    second = root / "models" / "second.onnx"
    data = first.read_bytes()
    second.write_bytes(data)
    async with serving(write_config(root)) as daemon:
        drop(first, root / "inbox")
        drop(second, root / "inbox")
        await daemon.wait_for("job.succeeded")
        duplicate = (await daemon.wait_for("job.duplicate"))[0]
        original = daemon.events("job.succeeded")[0]
        assert duplicate["original_job_id"] == original["job_id"]
        assert duplicate["result"] == original["result"]
    assert len(results(root / "outbox")) == 1
    done = root / "state" / "done"
    assert sorted(p.name for p in done.iterdir()) == ["first", "second"]
    report = json.loads((done / duplicate["name"] / "report.json").read_text())  # the pointer's
    assert (
        report["status"] == "duplicate" and report["duplicate_of"]["result"] == original["result"]
    )
    # no second copy of the same bytes: the duplicate's done/ folder holds its reports only
    assert sorted(p.name for p in (done / duplicate["name"]).iterdir()) == [
        "report.html",
        "report.json",
        "report.md",
    ]
    kept = done / original["name"] / f"{original['name']}.onnx"
    assert kept.read_bytes() == data
    # done/ keeps the daemon's file_mode (0640 in the tests' config), as the outbox does
    modes = {stat.S_IMODE(p.stat().st_mode) for p in done.rglob("report.*")}
    assert modes == {0o640}


async def _many_models(root: Path, count: int) -> None:
    names = [f"m{k:03d}" for k in range(count)]
    staged_paths = [staged(root, name, seed=k) for k, name in enumerate(names)]
    # Polling only (as on NFS): no inotify, and a rescan too rare to be what finds them.
    config = write_config(root, watch_mode="poll", poll_interval=0.3, rescan_interval=60.0)
    async with serving(config) as daemon:
        assert daemon.events("watch.started")[0]["mode"] == "poll"
        for path in staged_paths:
            drop(path, root / "inbox")
        await daemon.wait_for("job.succeeded", count=count, timeout=30 + count * 2)
        claimed = [ln["name"] for ln in daemon.events("job.claimed")]
        assert sorted(claimed) == names  # each once
        assert outcome_names(daemon, "job.succeeded") == names
        assert not daemon.events("job.failed")
    assert [p.name for p in results(root / "outbox")] == names
    assert not list((root / "state" / "processing").iterdir())


@pytest.mark.anyio
async def test_ten_models_dropped_at_once_each_finish_once(root: Path) -> None:
    """Ten models renamed in at once all finish, each exactly once."""
    await _many_models(root, 10)


@pytest.mark.slow
@run_slow
@pytest.mark.anyio
async def test_a_hundred_models_dropped_at_once_each_finish_once(root: Path) -> None:
    """A hundred models renamed in at once all finish, each exactly once."""
    await _many_models(root, 100)


@pytest.mark.anyio
async def test_jobs_waiting_at_start_are_claimed_highest_priority_first(root: Path) -> None:
    """Models already in the inbox at start-up are processed, a sidecar priority claimed first;
    with ``keep_input = false`` the inputs are deleted, not kept in ``done/``."""
    inbox = root / "inbox"
    for k, name in enumerate(("a", "b", "c", "urgent")):
        save_model(chain_model(30 + k), inbox / f"{name}.onnx")
    (inbox / "urgent.toml").write_text("priority = 9\n")
    async with serving(write_config(root, keep_input=False)) as daemon:
        await daemon.wait_for("job.succeeded", count=4)
        assert [ln["name"] for ln in daemon.events("job.claimed")] == ["urgent", "a", "b", "c"]
        assert daemon.events("job.claimed", name="urgent")[0]["priority"] == 9
    assert [p.name for p in results(root / "outbox")] == ["a", "b", "c", "urgent"]
    assert list(inbox.iterdir()) == [] and list((root / "state" / "done").iterdir()) == []


@pytest.mark.anyio
async def test_deleted_inbox_is_recreated_and_watched_again(root: Path) -> None:
    """Removing the inbox: the rescan recreates it, restarts the watch, and new files are jobs."""
    async with serving(write_config(root)) as daemon:
        (root / "inbox").rmdir()
        await daemon.wait_for("watch.restarted", timeout=10)
        assert (root / "inbox").is_dir()
        drop(staged(root, "after"), root / "inbox")
        await daemon.wait_for("job.succeeded", name="after")


@pytest.mark.anyio
async def test_planning_worker_killed_every_run_fails_after_max_attempts(root: Path) -> None:
    """A job whose planning worker is SIGKILLed each run is retried, then failed as worker_crashed."""
    staged(root, "doomed")
    env = planworker_hook(root, "os.kill(os.getpid(), signal.SIGKILL)")
    async with serving(write_config(root, max_attempts=2), env=env) as daemon:
        drop(root / "models" / "doomed.onnx", root / "inbox")
        failed = (await daemon.wait_for("job.failed", name="doomed"))[0]
        assert failed["reason"] == "worker_crashed"
        assert len(daemon.events("job.retried")) == 1
    error = json.loads((root / "state" / "failed" / "doomed" / "error.json").read_text())
    assert error["reason"] == "worker_crashed" and "2 runs" in error["message"]
    record = next((root / "state" / "journal").glob("*.json"))
    assert json.loads(record.read_text())["attempts"] == 2


# --- the status word ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_each_surface_says_what_proved_the_job(root: Path) -> None:
    """An onnxruntime job is ``verified`` and a backend-none job ``not_compiled`` in the log line,
    report.json and status.json alike; nothing says ``compiled``, as nothing compiled."""
    config = write_config(root, backend="onnxruntime")
    sidecar = root / "models" / "planned.toml"
    async with serving(config) as daemon:
        drop(staged(root, "checked"), root / "inbox")
        staged(root, "planned", seed=3)
        sidecar.write_text('backend = "none"\n')
        drop(sidecar, root / "inbox")
        drop(root / "models" / "planned.onnx", root / "inbox")
        done = await daemon.wait_for("job.succeeded", count=2, timeout=120)

        def results_shown() -> bool:  # status.json is rewritten at most every 0.5 s
            status = json.loads((root / "run" / "status.json").read_text())
            return bool(status["results"] == {"compiled": 0, "verified": 1, "not_compiled": 1})

        await daemon.wait_until(results_shown, 10, "both results in status.json")
    said = {line["name"]: line["status"] for line in done}
    assert said == {"checked": "verified", "planned": "not_compiled"}
    for name, word in said.items():
        report = json.loads((root / "outbox" / name / "report.json").read_text())
        assert (report["status"], report["schema"]) == (word, "sharderd.report/3")


@pytest.mark.anyio
async def test_auto_on_an_ipu_target_without_poprt_fails_the_job_not_onnxruntime(
    root: Path,
) -> None:
    """A sidecar asking ``auto`` for the IPU target, on a daemon where poprt does not import: the
    job fails as backend_unavailable with the fix; onnxruntime runs only when asked for."""
    sidecar = root / "models" / "wants_auto.toml"
    async with serving(write_config(root, backend="onnxruntime")) as daemon:
        staged(root, "wants_auto")
        sidecar.write_text('backend = "auto"\ntarget = "ipu-mk2"\n')
        drop(sidecar, root / "inbox")
        drop(root / "models" / "wants_auto.onnx", root / "inbox")
        (failed,) = await daemon.wait_for("job.failed", timeout=60)
    assert failed["reason"] == "backend_unavailable"
    assert "needs PopRT, but poprt does not import here" in failed["message"]
    assert not daemon.events("attempt.started")  # nothing ran on the CPU in its place
    error = json.loads((root / "state" / "failed" / "wants_auto" / "error.json").read_text())
    assert "sharderd sdk-env" in error["hint"]
