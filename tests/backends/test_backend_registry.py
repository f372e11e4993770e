"""One registry of backends: the worker runs what it names, extra backends come from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_backend import REGISTRATION, worker_env

from sharderd.backends import onnxruntime, poprt
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import (
    BACKENDS,
    EXTRA_BACKENDS_ENV,
    PROVEN_STATUS,
    SHIPPED,
    AttemptHosts,
    Backend,
    fallback_warnings,
    load_backend,
    registered,
    resolve_backend,
)
from sharderd.errors import BackendUnavailableError, ConfigError
from sharderd.target import BUILTIN_TARGETS

REPO = Path(__file__).resolve().parents[2]


def _worker(tmp_path: Path, backend: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    request = AttemptRequest(
        backend, str(tmp_path / "m.onnx"), str(tmp_path / "m.popef"), 2, {"fault": "succeed"}
    )
    request.write(tmp_path / "request.json")
    return subprocess.run(
        [sys.executable, "-m", "sharderd.backends.worker", "request.json", "result.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shipped_backends_are_backends_and_none_is_only_a_choice() -> None:
    assert isinstance(load_backend("poprt"), Backend)
    assert load_backend("poprt") is poprt
    assert load_backend("onnxruntime") is onnxruntime
    assert set(BACKENDS) == {*SHIPPED, "none"}
    assert "fault" not in registered({})


def test_extra_backends_come_from_the_environment() -> None:
    env = {EXTRA_BACKENDS_ENV: f" {REGISTRATION} , other=os.path:join"}
    assert registered(env) == {**SHIPPED, "fault": "fault_backend", "other": "os.path:join"}
    assert load_backend("fault", env).available()
    with pytest.raises(TypeError, match="'other'"):
        load_backend("other", env)  # os.path.join has neither available() nor run_attempt()
    with pytest.raises(ConfigError, match="NAME=MODULE"):
        registered({EXTRA_BACKENDS_ENV: "fault"})


def test_worker_runs_a_registered_extra_backend_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    base.pop(EXTRA_BACKENDS_ENV, None)
    refused = _worker(tmp_path, "fault", base)
    assert refused.returncode == 2
    assert "unknown backend 'fault' (known: onnxruntime, poprt)" in refused.stderr

    ran = _worker(tmp_path, "fault", worker_env(base))
    assert ran.returncode == 0, ran.stderr
    outcome = AttemptOutcome.from_json(
        json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    )
    assert outcome.outcome == "ok"
    assert "nothing injected" in outcome.message


class _Cluster:
    """Hosts that answer for poprt only, as the Ray runner does with ``sdk_resource`` set."""

    def __init__(self, poprt_offered: bool | None) -> None:
        self.poprt_offered = poprt_offered

    async def refresh(self) -> None:
        return None

    def offers(self, backend: str) -> bool | None:
        return self.poprt_offered if backend == "poprt" else None


def test_a_cluster_answers_for_poprt_whatever_this_host_imports() -> None:
    """Here poprt does not import (the suite's own Python); the cluster's answer decides."""
    ipu = BUILTIN_TARGETS["ipu-mk2"]
    assert not poprt.available() and isinstance(_Cluster(True), AttemptHosts)
    with pytest.raises(BackendUnavailableError):
        resolve_backend("poprt", ipu)
    assert resolve_backend("poprt", ipu, _Cluster(True)) == "poprt"
    assert resolve_backend("auto", ipu, _Cluster(True)) == "poprt"
    # no node offers it yet: named, its attempt waits for one; auto takes what is there
    assert resolve_backend("poprt", ipu, _Cluster(False)) == "poprt"
    local = resolve_backend("auto", ipu)
    assert resolve_backend("auto", ipu, _Cluster(False)) == local != "poprt"
    with pytest.raises(BackendUnavailableError):
        resolve_backend("poprt", ipu, _Cluster(None))  # the cluster cannot tell: ask here


def test_auto_without_fallback_refuses_an_ipu_target_without_poprt() -> None:
    """The daemon's ``auto`` (no fallback): an IPU target with no poprt fails, naming the fix; a
    CPU target, or poprt offered, is as before; the CLI's ``auto`` falls back, with a warning."""
    ipu, cpu = BUILTIN_TARGETS["ipu-mk2"], BUILTIN_TARGETS["cpu"]
    with pytest.raises(BackendUnavailableError) as refused:
        resolve_backend("auto", ipu, fallback=False)
    assert "needs PopRT, but poprt does not import here" in refused.value.message
    assert "sharderd sdk-env" in str(refused.value.hint)
    assert resolve_backend("auto", ipu, _Cluster(True), fallback=False) == "poprt"
    assert resolve_backend("auto", cpu, fallback=False) == resolve_backend("auto", cpu)
    fell_back = resolve_backend("auto", ipu)
    assert fell_back in ("onnxruntime", "none")
    (warning,) = fallback_warnings("auto", fell_back, ipu)
    assert "nothing was compiled" in warning and "ipu-mk2" in warning
    assert fallback_warnings("onnxruntime", "onnxruntime", ipu) == []  # asked for
    assert fallback_warnings("auto", "onnxruntime", cpu) == []  # the right backend for a CPU
    assert fallback_warnings("auto", "poprt", ipu) == []


def test_a_missing_backend_says_the_other_one_as_a_rerun() -> None:
    with pytest.raises(BackendUnavailableError) as missing:
        resolve_backend("poprt", BUILTIN_TARGETS["ipu-mk2"])
    assert missing.value.reruns == ({"backend": "onnxruntime"},)


def test_success_statuses_say_what_each_backend_did() -> None:
    assert PROVEN_STATUS == {"poprt": "compiled", "onnxruntime": "verified", "none": "not_compiled"}
    assert set(PROVEN_STATUS) == set(BACKENDS)
