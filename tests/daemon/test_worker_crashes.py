"""``[daemon] max_worker_crashes`` bounds a job's dying workers apart from its compiles.

Unset, a job's ``max_attempts`` bounds both, as before the key existed (``test_service``
covers that); set, it alone decides how many runs a job may lose to a worker killed by a signal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from daemon_helpers import chain_model, drop, planworker_hook, save_model, write_config
from daemon_served import serving

from sharderd.config import DaemonConfig, load_config
from sharderd.errors import ConfigError

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)


def test_the_crash_limit_is_its_own_key_or_else_max_attempts(tmp_path: Path) -> None:
    assert DaemonConfig(max_attempts=5).worker_crash_limit(3) == 3  # the job's own max_attempts
    assert DaemonConfig(max_attempts=5).worker_crash_key() == "max_attempts"
    both = DaemonConfig(max_attempts=5, max_worker_crashes=2)
    assert (both.worker_crash_limit(3), both.worker_crash_key()) == (2, "max_worker_crashes")
    path = tmp_path / "sharderd.toml"
    path.write_text("[daemon]\nmax_attempts = 4\n\nmax_worker_crashes = 0\n")
    with pytest.raises(ConfigError, match=r":4: \[daemon\]: max_worker_crashes must be >= 1"):
        load_config(path)


@pytest.mark.anyio
async def test_one_allowed_crash_fails_the_job_at_the_first_dead_worker(tmp_path: Path) -> None:
    """max_attempts 8 leaves room for compiles; max_worker_crashes 1 fails the job at once."""
    (tmp_path / "models").mkdir()
    model = save_model(chain_model(), tmp_path / "models" / "doomed.onnx")
    env = planworker_hook(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    config = write_config(tmp_path, max_attempts=8, max_worker_crashes=1)
    async with serving(config, env=env) as daemon:
        drop(model, tmp_path / "inbox")
        failed = (await daemon.wait_for("job.failed", name="doomed"))[0]
        assert failed["reason"] == "worker_crashed"
        assert daemon.events("job.retried") == []
    error = json.loads((tmp_path / "state" / "failed" / "doomed" / "error.json").read_text())
    assert "1 runs" in error["message"] and "(max_worker_crashes = 1)" in error["message"]
    record = next((tmp_path / "state" / "journal").glob("*.json"))
    assert json.loads(record.read_text())["attempts"] == 1
