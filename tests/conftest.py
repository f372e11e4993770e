"""Shared fixtures.

Engine tests (test_load, test_analyze, test_annotate, test_cli_engine) use the first block:
``model_path`` saves a small example model to disk, ``run_cli`` runs ``python -m sharderd.cli``
as a real process, ``shard`` runs ``sharderd shard`` in-process and re-reads what it wrote.
Other fixtures go below that block.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest

from sharderd import examples
from sharderd.cli import main as cli_main

# --- engine fixtures ------------------------------------------------------------------------------

SMALL_OPTIONS: dict[str, dict[str, Any]] = {
    "transformer": {"layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 50},
    "cnn": {"blocks": 4, "channels": 8, "image": 32, "batch": 2},
    "shared_weights": {"layers": 6, "hidden": 16},
    "with_if": {"hidden": 16},
    "multi_io": {"hidden": 16},
    "chain": {"nodes": 23, "hidden": 16},
}
"""Sizes that keep every example fast to plan and to run in onnxruntime."""

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def model_path(tmp_path: Path) -> Callable[..., Path]:
    """``model_path(kind_or_model, name=None, external_data=False, **options)`` → a saved .onnx."""

    def save(
        model: str | onnx.ModelProto,
        name: str | None = None,
        *,
        external_data: bool = False,
        **options: Any,
    ) -> Path:
        if isinstance(model, str):
            proto = examples.EXAMPLES[model](**{**SMALL_OPTIONS[model], **options})
            name = name or f"{model}.onnx"
        else:
            proto = model
            name = name or "model.onnx"
        folder = tmp_path / "models"
        folder.mkdir(exist_ok=True)
        return examples.save(proto, folder / name, external_data=external_data)

    return save


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli(*args, cwd=...)``: the real CLI in a child process (real exit code and stderr)."""

    def run(
        *args: str | os.PathLike[str], cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        return subprocess.run(
            [sys.executable, "-m", "sharderd.cli", *map(str, args)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return run


@dataclass(frozen=True, slots=True)
class Sharded:
    """What ``sharderd shard`` wrote, re-read from disk."""

    out: Path
    model: onnx.ModelProto
    """``<stem>.sharded.onnx`` loaded without external data."""
    report: dict[str, Any]
    yaml_text: str


@pytest.fixture
def shard(tmp_path: Path) -> Callable[..., Sharded]:
    """``shard(model_path, devices, *extra_args)``: ``sharderd shard --backend none`` in-process, exit 0.

    The engine alone (issue 2): plan, annotate, write; no compile backend, status ``not_compiled``.
    """

    def run(model: Path, devices: int, *extra: str) -> Sharded:
        stem = model.name.removesuffix(".onnx")
        out = tmp_path / f"out-{stem}-{devices}"
        code = cli_main(
            [
                "shard",
                str(model),
                "--devices",
                str(devices),
                "--out",
                str(out),
                "--backend",
                "none",
                "-q",
                *extra,
            ]
        )
        assert code == 0, f"sharderd shard exited {code}"
        return Sharded(
            out=out,
            model=onnx.load(str(out / f"{stem}.sharded.onnx"), load_external_data=False),
            report=json.loads((out / "report.json").read_text()),
            yaml_text=(out / f"{stem}.sharding.yaml").read_text(),
        )

    return run


# --- other fixtures -------------------------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing in for systemd's ``NOTIFY_SOCKET``: its address and the socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    sock.bind(address)
    sock.setblocking(False)
    yield address, sock
    sock.close()
