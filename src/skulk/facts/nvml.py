"""A passive NVML collector: each NVIDIA GPU's name, VRAM, utilisation, temperature, power.

`gpu_readings` is the pure half: raw NVML answers (`NvmlDevice`, recorded as-is, so tests
replay snapshots of real machines) in, `GpuReading`s for `NodeResources` out. A device
whose memory NVML cannot report is left out: placement must never admit against a guess.
`read_nvml` is the impure half and never raises: no NVML library, no driver, or a failing
call yields None, and the node simply reports no GPUs. It only reads; it never changes a
device setting.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from skulk.shared.types.telemetry import GpuReading

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlDevice:
    """One device's raw NVML answers; None where that call failed."""

    index: int
    name: str | bytes
    memory_total: int | None
    memory_free: int | None
    utilization_gpu: int | None = None
    """nvmlDeviceGetUtilizationRates(...).gpu, percent."""
    temperature_c: int | None = None
    power_mw: int | None = None
    """nvmlDeviceGetPowerUsage, milliwatts."""


def gpu_readings(devices: Sequence[NvmlDevice]) -> list[GpuReading]:
    readings: list[GpuReading] = []
    for device in devices:
        if device.memory_total is None or device.memory_free is None:
            continue
        name = device.name.decode("utf-8", "replace") if isinstance(device.name, bytes) else device.name
        readings.append(GpuReading(
            vendor="nvidia",
            index=device.index,
            name=name,
            vram_total_bytes=device.memory_total,
            vram_free_bytes=min(device.memory_free, device.memory_total),
            utilization_percent=device.utilization_gpu,
            temperature_c=device.temperature_c,
            power_watts=None if device.power_mw is None else device.power_mw / 1000.0,
        ))
    return readings


def read_nvml() -> list[NvmlDevice] | None:
    """Every device's answers, or None when NVML is unavailable."""
    try:
        import pynvml  # nvidia-ml-py
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = _try(lambda handle=handle: pynvml.nvmlDeviceGetMemoryInfo(handle))
            devices.append(NvmlDevice(
                index=index,
                name=_try(lambda handle=handle: pynvml.nvmlDeviceGetName(handle)) or f"NVIDIA GPU {index}",
                memory_total=None if memory is None else int(memory.total),
                memory_free=None if memory is None else int(memory.free),
                utilization_gpu=_try(lambda handle=handle: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
                temperature_c=_try(lambda handle=handle: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))),
                power_mw=_try(lambda handle=handle: int(pynvml.nvmlDeviceGetPowerUsage(handle))),
            ))
        return devices
    except Exception as exc:
        log.info("NVML failed while reading devices: %s", exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _try(call):
    try:
        return call()
    except Exception:
        return None


def driver_cuda_version() -> int | None:
    """The newest CUDA version the NVIDIA driver supports, as NVML encodes it (12080 for
    12.8), or None without NVML: which CUDA wheel this machine can run."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return _try(lambda: int(pynvml.nvmlSystemGetCudaDriverVersion()))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def collect_gpus() -> list[GpuReading]:
    """The node's GPU readings now ([] without NVML)."""
    devices = read_nvml()
    return gpu_readings(devices) if devices else []


__all__ = ["NvmlDevice", "collect_gpus", "driver_cuda_version", "gpu_readings", "read_nvml"]
