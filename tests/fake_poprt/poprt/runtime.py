"""Fake ``poprt.runtime``: ``DeviceManager``, ``RuntimeConfig`` and ``Runner`` over a fake PopEF.

``Runner(popef, config=None)`` takes a PopEF path or a ``compiler.Executable``; ``execute`` fills
the caller's preallocated outputs (zeros) after a short blocking wait proportional to the
slowest stage's FLOPs, capped at a few milliseconds so benchmarks stay fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from poprt.compiler import Executable

__all__ = ["DataDesc", "Device", "DeviceManager", "Runner", "RuntimeConfig"]

_HARDWARE = "ipu2"
_FLOPS_PER_S = 250e12 * 0.25
_MAX_LATENCY_S = 2e-3
_BASE_LATENCY_S = 20e-6


@dataclass(frozen=True, slots=True)
class Device:
    device_id: int
    num_ipus: int


class DeviceManager:
    """An M2000-like host: IPU generation ``ipu2``, 16 IPUs."""

    def ipu_hardware_version(self) -> str:
        return _HARDWARE

    def get_num_devices(self) -> int:
        return 16

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


class _Done:
    """The future ``execute_async`` returns; the work is already done when it is handed out."""

    def wait(self) -> None:
        return None


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
        slowest = max(self._popef.get("stage_flops") or [0])
        self._latency_s = min(_BASE_LATENCY_S + slowest / _FLOPS_PER_S, _MAX_LATENCY_S)

    def get_execute_inputs(self) -> list[DataDesc]:
        return [DataDesc(d["name"], d["shape"], d["dtype"]) for d in self._popef["inputs"]]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [DataDesc(d["name"], d["shape"], d["dtype"]) for d in self._popef["outputs"]]

    def execute(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        if self.config.validate_io_params:
            _check(self.get_execute_inputs(), inputs, "input")
            _check(self.get_execute_outputs(), outputs, "output")
        time.sleep(self._latency_s)  # noqa: TID251 - a device run blocks the caller too
        for array in outputs.values():
            array[...] = 0

    def execute_async(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> _Done:
        self.execute(inputs, outputs)
        return _Done()


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
