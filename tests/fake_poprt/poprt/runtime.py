"""Fake ``poprt.runtime``: ``DeviceManager``, ``RuntimeConfig`` and ``Runner`` over a fake PopEF.

``Runner(popef, config=None)`` takes a PopEF path or a ``compiler.Executable``; ``execute`` fills
the caller's preallocated outputs (zeros). Time is a pipeline's: every stage computes one batch
at a time (its FLOPs, capped so benchmarks stay fast), then hands its activations to the next
over a link that is a resource of its own (the copy overlaps the stage's next batch). A lone
batch takes every compute and every copy in turn (latency); batches queued with ``execute_async``
leave one per slowest stage or link (throughput). A split with big boundary tensors can so lose
on latency and win on throughput. ``FAKE_POPRT_RUNTIME`` (JSON) overrides ``flops_per_s``,
``link_bytes_per_s``, ``stage_base_s`` and ``stage_cap_s``; the defaults put a stage of the test
models at tenths of a millisecond, well above Python's own overhead per call.

Attachment, as the real runtime's: a ``Runner`` attaches to a free device of the PopEF's
``num_ipus`` (an aligned group of IPUs, as an M2000's devices are) for its lifetime, and throws
when none is free. With ``FAKE_POPRT_DEVICE_DIR`` set, attachments are shared by every process on
the host through that folder (one ``ipu<N>`` file per attached IPU holding the owner's pid; a dead
owner's file is stale) and logged to ``attach.log`` there (JSON lines ``attach``,
``attach_failed``, ``detach``); ``FAKE_POPRT_IPUS`` is the host's IPU count (default 16).
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from poprt.compiler import Executable

__all__ = ["DataDesc", "Device", "DeviceManager", "Runner", "RuntimeConfig"]

_HARDWARE = "ipu2"
_RUNTIME_DEFAULTS = {
    "flops_per_s": 1e12,
    "link_bytes_per_s": 8e9,
    "stage_base_s": 50e-6,
    "stage_cap_s": 5e-3,
}


def _runtime_knobs() -> dict[str, float]:
    raw = os.environ.get("FAKE_POPRT_RUNTIME")
    values = json.loads(raw) if raw else {}
    unknown = set(values) - set(_RUNTIME_DEFAULTS)
    if unknown:
        raise ValueError(
            f"FAKE_POPRT_RUNTIME: unknown keys {sorted(unknown)} (known: {sorted(_RUNTIME_DEFAULTS)})"
        )
    return {**_RUNTIME_DEFAULTS, **{k: float(v) for k, v in values.items()}}


@dataclass(frozen=True, slots=True)
class Device:
    device_id: int
    num_ipus: int


class DeviceManager:
    """An M2000-like host: IPU generation ``ipu2``, 16 IPUs."""

    def ipu_hardware_version(self) -> str:
        return _HARDWARE

    def get_num_devices(self) -> int:
        return _host_ipus()

    def get_device(self, num_ipus: int) -> Device:
        if num_ipus not in (1, 2, 4, 8, 16):
            raise RuntimeError(f"Failed to attach to a device with {num_ipus} IPUs")
        return Device(device_id=0, num_ipus=num_ipus)

    def get_specific_device(self, device_id: int) -> Device:
        return Device(device_id=device_id, num_ipus=1)


@dataclass(slots=True)
class RuntimeConfig:
    timeout_ns: int = 10_000_000
    batching_dim: int = 0
    ring_buffer_size_multiplier: int = 2
    check_package_hash: bool = True
    validate_io_params: bool = True
    auto_reset: bool = False


class DataDesc:
    """An input or output of the executable: ``name``, ``shape`` and its numpy dtype."""

    def __init__(self, name: str, shape: list[int], dtype: str) -> None:
        self.name = name
        self.shape = list(shape)
        self._dtype = np.dtype(dtype)

    def numpy_data_type(self) -> np.dtype:
        return self._dtype

    def __repr__(self) -> str:
        return f"DataDesc(name={self.name!r}, shape={self.shape}, dtype={self._dtype.name})"


class _Future:
    """What ``execute_async`` returns: ``wait`` blocks until the batch has left the last stage."""

    def __init__(self, done_at: float) -> None:
        self._done_at = done_at

    def wait(self) -> None:
        left = self._done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)  # noqa: TID251 - a device run blocks the caller too


def _host_ipus() -> int:
    return int(os.environ.get("FAKE_POPRT_IPUS", "16"))


def _log(folder: Path, event: str, ipus: list[int]) -> None:
    line = json.dumps({"event": event, "ipus": ipus, "pid": os.getpid(), "t": time.time()})
    with open(folder / "attach.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _owner_alive(path: Path) -> bool:
    try:
        os.kill(int(path.read_text() or "0"), 0)
    except (OSError, ValueError):
        return False
    return True


def _claim(path: Path) -> bool:
    """Take one IPU's file; a file whose owner died is stale and taken over."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _owner_alive(path):
                return False
            path.unlink(missing_ok=True)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def _attach(num_ipus: int) -> list[int]:
    """Attach to a free aligned group of ``num_ipus`` IPUs, or throw as the runtime does."""
    total = _host_ipus()
    folder = os.environ.get("FAKE_POPRT_DEVICE_DIR")
    if num_ipus > total:
        raise RuntimeError(f"Failed to attach to a device with {num_ipus} IPUs ({total} on host)")
    if not folder:
        return list(range(num_ipus))
    root = Path(folder)
    for first in range(0, total - num_ipus + 1, num_ipus):
        group = list(range(first, first + num_ipus))
        taken = []
        for ipu in group:
            if not _claim(root / f"ipu{ipu}"):
                break
            taken.append(ipu)
        if len(taken) == num_ipus:
            _log(root, "attach", group)
            return group
        for ipu in taken:
            (root / f"ipu{ipu}").unlink(missing_ok=True)
    _log(root, "attach_failed", [])
    raise RuntimeError(f"Failed to attach to a device with {num_ipus} IPUs: all are attached")


def _detach(ipus: list[int]) -> None:
    folder = os.environ.get("FAKE_POPRT_DEVICE_DIR")
    if folder and ipus:
        _log(Path(folder), "detach", ipus)
        for ipu in ipus:
            (Path(folder) / f"ipu{ipu}").unlink(missing_ok=True)
        ipus.clear()


class Runner:
    def __init__(self, popef: str | Executable, config: RuntimeConfig | None = None) -> None:
        self.config = config or RuntimeConfig()
        if isinstance(popef, Executable):
            self._popef = popef.popef
        else:
            path = Path(popef)
            if not path.is_file():
                raise RuntimeError(f"PopEF file {popef} does not exist")
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != "fake-popef":
                raise RuntimeError(f"{popef} is not a PopEF file")
            self._popef = data
        if self._popef["ipu_version"] != _HARDWARE:
            raise RuntimeError(
                f"The executable was compiled for {self._popef['ipu_version']} but the device is {_HARDWARE}"
            )
        self._ipus = _attach(int(self._popef.get("num_ipus", 1)))
        weakref.finalize(self, _detach, self._ipus)
        atexit.register(_detach, self._ipus)
        knobs = _runtime_knobs()
        flops = self._popef.get("stage_flops") or [0]
        sends = self._popef.get("stage_send_bytes") or [0] * len(flops)
        cap = knobs["stage_cap_s"]
        self.stage_s = tuple(
            min(knobs["stage_base_s"] + f / knobs["flops_per_s"], cap) for f in flops
        )
        self.send_s = tuple(min(b / knobs["link_bytes_per_s"], cap) for b in sends)
        self._free_at = [0.0] * len(self.stage_s)
        self._link_free_at = [0.0] * len(self.stage_s)

    def get_execute_inputs(self) -> list[DataDesc]:
        return [DataDesc(d["name"], d["shape"], d["dtype"]) for d in self._popef["inputs"]]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [DataDesc(d["name"], d["shape"], d["dtype"]) for d in self._popef["outputs"]]

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        self.execute_async(inputs, outputs).wait()

    def execute_async(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> _Future:
        if self.config.validate_io_params:
            _check(self.get_execute_inputs(), inputs, "input")
            _check(self.get_execute_outputs(), outputs, "output")
        at = time.perf_counter()
        for stage, (compute, send) in enumerate(zip(self.stage_s, self.send_s, strict=True)):
            at = max(at, self._free_at[stage]) + compute
            self._free_at[stage] = at
            if send:
                at = max(at, self._link_free_at[stage]) + send
                self._link_free_at[stage] = at
        for array in outputs.values():
            array[...] = 0
        return _Future(at)


def _check(descs: list[DataDesc], arrays: Mapping[str, Any], kind: str) -> None:
    for desc in descs:
        if desc.name not in arrays:
            raise RuntimeError(f"Missing {kind} '{desc.name}'")
        array = arrays[desc.name]
        if list(np.shape(array)) != desc.shape or np.asarray(array).dtype != desc.numpy_data_type():
            raise RuntimeError(
                f"{kind} '{desc.name}' expects {desc.numpy_data_type().name}{desc.shape}, "
                f"got {np.asarray(array).dtype.name}{list(np.shape(array))}"
            )
    extra = set(arrays) - {d.name for d in descs}
    if extra:
        raise RuntimeError(f"Unknown {kind} '{sorted(extra)[0]}'")
