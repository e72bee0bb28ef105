"""Which memory a placed shard lives in: a GPU node's VRAM or system RAM.

A shard served on a GPU compute (cuda, rocm, vulkan) by a node that reports its GPUs' VRAM
is planned on a "vram" device: the capacity planner then keeps the layers that fit in VRAM
there (llama.cpp's n_gpu_layers) and sheds the rest to RAM, and the instance's context is
sized from VRAM rather than from the CPU floor. Several GPUs pool (llama.cpp splits layers
across every visible device). Anything else (a CPU tag, Metal's unified memory, a node with
no VRAM reading) is planned on RAM, as before. Pure.
"""

from __future__ import annotations

from skulk.capacity.planner import DeviceSnapshot
from skulk.shared.types.telemetry import NodeResources

VRAM_COMPUTES: frozenset[str] = frozenset({"cuda", "rocm", "vulkan"})
"""Computes whose weights and KV live in discrete VRAM (Metal shares system memory)."""


def _vram_gpus(backend: str, reading: NodeResources):
    compute = backend.partition("-")[2]
    return reading.gpus if compute in VRAM_COMPUTES else []


def shard_device(backend: str, reading: NodeResources, available_ram_bytes: int) -> DeviceSnapshot:
    gpus = _vram_gpus(backend, reading)
    if not gpus:
        return DeviceSnapshot("ram", reading.memory.ram_total_bytes, available_ram_bytes)
    return DeviceSnapshot("vram", sum(g.vram_total_bytes for g in gpus), sum(g.vram_free_bytes for g in gpus))


def discrete_vram_bytes(backend: str, reading: NodeResources) -> int | None:
    """The pooled VRAM a shard on `backend` is sized against; None when it runs from RAM."""
    gpus = _vram_gpus(backend, reading)
    return sum(g.vram_total_bytes for g in gpus) if gpus else None


__all__ = ["VRAM_COMPUTES", "discrete_vram_bytes", "shard_device"]
