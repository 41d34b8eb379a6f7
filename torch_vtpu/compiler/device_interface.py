"""Dynamo's runtime view of the vtpu device (torch._dynamo.device_interface):
what Dynamo and AOTAutograd ask of a device while they trace and run compiled
graphs (availability, the current device, synchronisation, properties)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

from .. import _device


@dataclass(frozen=True)
class VtpuDeviceProperties:
    name: str
    type: str
    # The host target executes on the CPU's cores.
    multi_processor_count: int
    total_memory: int


def _properties() -> VtpuDeviceProperties:
    free, total = _device.mem_get_info()
    return VtpuDeviceProperties(name="vtpu (host target)", type="vtpu",
                                multi_processor_count=os.cpu_count() or 1, total_memory=total)


class VtpuInterface(DeviceInterface):
    class device:  # noqa: N801 - the interface's spelling
        def __new__(cls, device: torch.types.Device) -> Any:
            return _device.device(device)

    class Event(torch.Event):
        """Host-clock timing: the vtpu stream has no device-side timer, so an
        event synchronises the stream and reads the clock."""

        def __init__(self, enable_timing: bool = True) -> None:
            self.time = 0.0

        def record(self, stream: Any = None) -> None:
            _device.synchronize()
            self.time = time.perf_counter()

        def elapsed_time(self, other: "VtpuInterface.Event") -> float:
            return (other.time - self.time) * 1000.0

        def synchronize(self) -> None:
            _device.synchronize()

        def query(self) -> bool:
            return True

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            _device.set_device(device)

        @staticmethod
        def current_device() -> int:
            return _device.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> VtpuDeviceProperties:
            return _properties()

    @staticmethod
    def current_device() -> int:
        return _device.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        _device.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        _device.set_device(device)
        return 0

    @staticmethod
    def exchange_device(device: int) -> int:
        _device.set_device(device)
        return 0

    @staticmethod
    def device_count() -> int:
        return _device.device_count()

    @staticmethod
    def is_available() -> bool:
        return _device.is_available()

    @staticmethod
    def current_stream() -> torch.Stream:
        return _device.current_stream()

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        _device.synchronize(device)

    @classmethod
    def get_device_properties(cls, device: torch.types.Device = None) -> VtpuDeviceProperties:
        return _properties()

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return _device.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False

    @classmethod
    def raise_if_triton_unavailable(cls, device: torch.types.Device = None) -> None:
        raise RuntimeError("vtpu does not run Triton kernels: compile for vtpu with backend='vtpu'")


def register() -> None:
    register_interface_for_device("vtpu", VtpuInterface)
    register_interface_for_device("vtpu:0", VtpuInterface)
