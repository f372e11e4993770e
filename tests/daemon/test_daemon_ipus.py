"""Jobs benchmarking at once share the host's IPUs: each run holds its devices, none attaches twice.

The fake PopRT's runtime attaches a ``Runner`` to free IPUs host-wide (``FAKE_POPRT_DEVICE_DIR``)
and throws, as the real one does, when they are attached already; it logs every attach and detach.
Three ``--optimal-perf`` jobs of 2, 2 and 4 devices compile side by side on a 4-IPU host, so their
benchmarks are ready together and only the daemon's IPU count keeps them apart.
"""

from __future__ import annotations

import json
from pathlib import Path

from daemon_helpers import chain_model, drop, running, save_model, write_config

JOBS = {"two_a": 2, "two_b": 2, "four": 4}
HOST_IPUS = 4


def _attach_log(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (folder / "attach.log").read_text().splitlines()]


def test_concurrent_benchmarks_never_share_an_ipu(tmp_path: Path) -> None:
    root = tmp_path
    devices_dir = root / "ipus"
    devices_dir.mkdir()
    config = write_config(root, backend="poprt", target="ipu-mk2", max_parallel_compiles=3)
    with open(config, "a") as f:  # [poprt] ipus left at -1: counted by the first compile
        f.write("\n[poprt]\nbenchmark_warmup = 2\nbenchmark_runs = 30\n")
    env = {
        "FAKE_POPRT_IPUS": str(HOST_IPUS),
        "FAKE_POPRT_DEVICE_DIR": str(devices_dir),
        "FAKE_POPRT_COMPILE_SECONDS": "1",
        "FAKE_POPRT_RUNTIME": json.dumps({"stage_base_s": 0.005}),
    }
    for seed, (name, devices) in enumerate(JOBS.items()):
        folder = root / "models" / name
        save_model(chain_model(seed, hidden=16), folder / "net.onnx")
        (folder / "sharderd.toml").write_text(f"devices = {devices}\noptimal_perf = true\n")
    with running(config, env=env, fake_poprt=True) as daemon:
        for name in JOBS:
            drop(root / "models" / name, root / "inbox")
        daemon.wait_for("job.succeeded", count=len(JOBS), timeout=240)

    log = _attach_log(devices_dir)
    assert not [e for e in log if e["event"] == "attach_failed"], log
    held: set[int] = set()
    most = 0
    for entry in log:  # attach is logged once held, detach before release: a lower bound
        ipus = set(entry["ipus"])  # type: ignore[call-overload]
        if entry["event"] == "attach":
            assert not held & ipus, (entry, held)
            held |= ipus
        else:
            held -= ipus
        most = max(most, len(held))
    assert most <= HOST_IPUS and not held
    for name, devices in JOBS.items():
        report = json.loads((root / "outbox" / name / "report.json").read_text())
        ok = [a for a in report["attempts"] if a["outcome"] == "ok"]
        assert ok and all(a["benchmark"] for a in ok), (name, report["attempts"])
        assert not any("benchmark failed" in (a.get("message") or "") for a in ok)
        attached = [e for e in log if e["event"] == "attach" and len(e["ipus"]) == devices]  # type: ignore[arg-type]
        assert attached, (name, log)
