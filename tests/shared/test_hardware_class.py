"""The canonical hardware class: one row per rule, memory snapping at its edges, and the
shape check telemetry applies to a class a peer gossiped."""

from __future__ import annotations

import pytest

from skulk.shared.hardware_class import hardware_class, is_hardware_class, memory_gb, slug
from skulk.shared.types.node_facts import GpuFact, NodeFacts
from skulk.shared.types.telemetry import GpuReading

GIB = 2**30
MAC = NodeFacts(os="darwin", machine="arm64", cpu_brand="Apple M4 Pro",
                gpus=[GpuFact(vendor="apple", name="Apple Silicon GPU", detected_by="apple_platform")])
LINUX = NodeFacts(os="linux", machine="x86_64")
STRIX = NodeFacts(os="linux", machine="x86_64",
                  gpus=[GpuFact(vendor="amd", name="AMD GPU card1 (0x1586)", detected_by="sysfs")])


def nvidia(name: str, vram_gib: float, index: int = 0) -> GpuReading:
    return GpuReading(vendor="nvidia", index=index, name=name, vram_total_bytes=int(vram_gib * GIB),
                      vram_free_bytes=0)


@pytest.mark.parametrize(
    ("facts", "ram_gib", "gpus", "expected"),
    [
        (MAC, 48, [], "apple-m4-pro-48gb"),
        (MAC.model_copy(update={"cpu_brand": "Apple M4"}), 24, [], "apple-m4-24gb"),
        (MAC.model_copy(update={"cpu_brand": None}), 16, [], "apple-silicon-16gb"),
        (LINUX, 23.4, [nvidia("NVIDIA GeForce RTX 4090", 23.99)], "nvidia-rtx-4090-24gb"),
        (LINUX, 512, [nvidia("NVIDIA H100 80GB HBM3", 79.6, 0), nvidia("NVIDIA H100 80GB HBM3", 79.6, 1)],
         "2x-nvidia-h100-hbm3-80gb"),
        (LINUX, 64, [nvidia("NVIDIA GeForce RTX 3060", 12), nvidia("NVIDIA GeForce RTX 4090", 24, 1)],
         "nvidia-rtx-4090-24gb"),
        (STRIX, 125.5, [], "linux-x86_64-amd-gpu-128gb"),
        (LINUX, 23.4, [], "linux-x86_64-cpu-24gb"),
        (LINUX, 31.3, [], "linux-x86_64-cpu-32gb"),
        (NodeFacts(os="linux", machine="aarch64"), 7.7, [], "linux-aarch64-cpu-8gb"),
        (NodeFacts(os="", machine=""), 4, [], "unknown-unknown-cpu-4gb"),
    ],
)
def test_hardware_class(facts, ram_gib, gpus, expected):
    assert hardware_class(facts, int(ram_gib * GIB), gpus) == expected
    assert is_hardware_class(expected)


@pytest.mark.parametrize(("gib", "gb"), [(0, 0), (0.9, 1), (15.5, 16), (17.9, 18), (23.4, 24), (24.5, 24),
                                         (35.8, 36), (79.6, 80), (140.4, 141), (1000, 1024)])
def test_memory_snaps_to_the_nearest_size_sold(gib, gb):
    assert memory_gb(int(gib * GIB)) == gb


def test_a_model_name_never_carries_odd_characters():
    assert slug("Apple M4 Max (16-core) \u00ae / studio's box") == "m4-max-16-core-studio-s-box"
    assert len(slug("x" * 500)) <= 32


@pytest.mark.parametrize(
    ("value", "ok"),
    [("apple-m4-24gb", True), ("unknown", True), ("Apple-M4", False), ("studio.local", False),
     ("10-0-0-2", True), ("a--b", False), ("-a", False), ("", False), ("a" * 65, False), (None, False), (3, False)],
)
def test_is_hardware_class(value, ok):
    assert is_hardware_class(value) is ok
