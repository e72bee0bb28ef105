"""The NVML collector from recorded snapshots: raw answers in, GpuReadings out."""

import pytest

from skulk.facts.nvml import NvmlDevice, gpu_readings
from skulk.shared.types.telemetry import GpuReading

GIB = 2**30

# Recorded shapes of nvmlDeviceGet* answers (names come back as bytes from older bindings).
H200 = NvmlDevice(0, "NVIDIA H200", 150_754_820_096, 149_978_087_424, 0, 31, 76_312)
L4_A = NvmlDevice(0, b"NVIDIA L4", 24_152_899_584, 23_580_000_000, 3, 44, 16_000)
L4_B = NvmlDevice(1, b"NVIDIA L4", 24_152_899_584, 10_000_000_000, 97, 71, 71_500)
SMALL = NvmlDevice(0, "NVIDIA GeForce GT 1030", 2 * GIB, GIB + 7, None, None, None)
NO_MEMORY = NvmlDevice(1, "NVIDIA A100 (MIG)", None, None, 0, 40, 50_000)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([], []),
        (
            [H200],
            [GpuReading(vendor="nvidia", index=0, name="NVIDIA H200", vram_total_bytes=150_754_820_096,
                        vram_free_bytes=149_978_087_424, utilization_percent=0, temperature_c=31, power_watts=76.312)],
        ),
        (
            [L4_A, L4_B],
            [
                GpuReading(vendor="nvidia", index=0, name="NVIDIA L4", vram_total_bytes=24_152_899_584,
                           vram_free_bytes=23_580_000_000, utilization_percent=3, temperature_c=44, power_watts=16.0),
                GpuReading(vendor="nvidia", index=1, name="NVIDIA L4", vram_total_bytes=24_152_899_584,
                           vram_free_bytes=10_000_000_000, utilization_percent=97, temperature_c=71, power_watts=71.5),
            ],
        ),
        (
            [SMALL],
            [GpuReading(vendor="nvidia", index=0, name="NVIDIA GeForce GT 1030", vram_total_bytes=2 * GIB,
                        vram_free_bytes=GIB + 7)],
        ),
        # A device whose memory NVML cannot read is never reported (no admission on a guess).
        ([H200, NO_MEMORY], [gpu_readings([H200])[0]]),
    ],
)
def test_gpu_readings(devices, expected):
    assert gpu_readings(devices) == expected


def test_free_never_exceeds_total():
    (reading,) = gpu_readings([NvmlDevice(0, "odd driver", 100, 150)])
    assert reading.vram_free_bytes == 100
