"""A real daemon bounds each job's planning: the issue's pathological model (If nested 20 deep) is
refused at once, a worker past ``planning_timeout`` or ``planning_memory_bytes`` is stopped and
its job filed ``planning_limit`` with the key to raise, and meanwhile other jobs run to the end
and the status heartbeat goes on.

Which worker is slow or hungry is the test's choice (a ``sitecustomize`` hook acting on the
model's name), so the limits are crossed by a known margin whatever the machine's load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest
from daemon_helpers import chain_model, drop, planworker_hook, running, save_model, write_config
from pathological import nested_if

from sharderd.errors import EXIT_BAD_INPUT

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

GIB = 1024**3
_HOOK = """
import sharderd.job.session as _session
_summary = _session.PlanService.summary
def _hooked(self):
    if "slow" in self.model_path.name:
        time.sleep(3600)
    if "hungry" in self.model_path.name:
        held = bytearray(b"x") * (2 * 1024**3)
        time.sleep(3600)
    return _summary(self)
_session.PlanService.summary = _hooked
"""


def test_limits_stop_one_job_and_the_others_run(tmp_path: Path) -> None:
    root = tmp_path
    timeout = 40.0
    config = write_config(
        root,
        planning_timeout=timeout,
        planning_memory_bytes=int(1.5 * GIB),
        max_parallel_compiles=2,
    )
    models = root / "models"
    models.mkdir()
    deep = models / "deep.onnx"
    onnx.save(nested_if(20), deep)
    with running(config, env=planworker_hook(root, _HOOK)) as daemon:
        for name, seed in (("slow", 1), ("hungry", 2)):
            drop(save_model(chain_model(seed), models / f"{name}.onnx"), root / "inbox")
        drop(deep, root / "inbox")
        refused = daemon.wait_for("job.failed", name="deep", timeout=60)[0]
        assert refused["reason"] == "bad_model" and "20 deep" in refused["message"]
        hungry = daemon.wait_for("job.failed", name="hungry", timeout=60)[0]
        assert hungry["reason"] == "planning_limit" and "planning_memory_bytes" in hungry["message"]
        drop(save_model(chain_model(3), models / "ok.onnx"), root / "inbox")
        daemon.wait_for("job.succeeded", name="ok", timeout=120)
        assert not daemon.events("job.failed", name="slow")  # still planning, and others ran
        first = json.loads((root / "run" / "status.json").read_text())["heartbeat"]
        slow = daemon.wait_for("job.failed", name="slow", timeout=timeout + 60)[0]
        assert slow["reason"] == "planning_limit"
        assert json.loads((root / "run" / "status.json").read_text())["heartbeat"] > first
    failed = root / "state" / "failed"
    deep_error = json.loads((failed / "deep" / "error.json").read_text())
    assert deep_error["exit_code"] == EXIT_BAD_INPUT
    error = json.loads((failed / "slow" / "error.json").read_text())
    assert (error["limit"], error["key"], error["allowed"]) == ("time", "planning_timeout", timeout)
    assert timeout <= error["used"] < timeout + 5
    memory = json.loads((failed / "hungry" / "error.json").read_text())
    assert (memory["limit"], memory["allowed"]) == ("memory", int(1.5 * GIB))
    assert int(1.5 * GIB) < memory["used"] < 3 * GIB
    readable = (failed / "slow" / "error.md").read_text()
    assert f"raise planning_timeout in the [daemon] table of {config} (now 40 s)" in readable
    assert f"sharderd retry slow --config {config}" in readable
    assert [p.name for p in (root / "outbox").iterdir() if not p.name.startswith(".")] == ["ok"]
