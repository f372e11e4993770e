"""The daemon's soak tests at CI size: ``kill -9`` at seeded random moments and a burst of models
with inotify events lost. The machinery (``kill_loop``, ``burst``, the exactly-once check) is in
``test_daemon_faults.py``, which ``bench/daemon_soak.py`` runs at full size; these tests sit in their
own file so that the two longest daemon tests run beside the others (``--dist loadfile``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_daemon_faults import FLAT_RSS_BYTES, burst, kill_loop, soak_jobs

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

run_soak = pytest.mark.skipif(
    not os.environ.get("SHARDERD_SOAK"), reason="full size; set SHARDERD_SOAK=1 to run"
)
run_slow = pytest.mark.skipif(
    not os.environ.get("SHARDERD_SLOW"), reason="slow; set SHARDERD_SLOW=1 to run"
)


def test_kill_9_loop_every_job_ends_exactly_once(tmp_path: Path) -> None:
    """12 jobs (duplicates, compiles, a folder with external data), 4 × kill -9 at seeded random
    moments: each job ends once, results equal a clean run's, no temp file or process is left."""
    outcome = kill_loop(tmp_path, soak_jobs(12), kills=4, seed=7)
    assert outcome.kills_mid_attempt >= 1
    assert outcome.succeeded + outcome.duplicates == 12 and outcome.duplicates >= 1


@pytest.mark.slow
@run_soak
def test_kill_9_loop_full_size(tmp_path: Path) -> None:
    """The same at full size: 60 jobs, 25 × kill -9."""
    outcome = kill_loop(
        tmp_path, soak_jobs(60), kills=25, seed=int(os.environ.get("SHARDERD_SOAK_SEED", "1"))
    )
    assert outcome.succeeded + outcome.duplicates == 60


def test_burst_of_150_models_each_processed_once_with_flat_memory(tmp_path: Path) -> None:
    """150 models renamed in at once with the inotify queue lowered to 16: each processed exactly
    once (the rescan finds what the lost events did not), and the daemon's RSS stays flat."""
    outcome = burst(tmp_path, 150, distinct=15)
    assert outcome.rss_end < outcome.rss_ready + FLAT_RSS_BYTES, outcome


@pytest.mark.slow
@run_slow
def test_burst_of_1000_distinct_models(tmp_path: Path) -> None:
    """The full burst: 1,000 different models at once, each processed once, RSS flat."""
    outcome = burst(tmp_path, 1000, distinct=1000)
    assert outcome.rss_end < outcome.rss_ready + FLAT_RSS_BYTES, outcome
