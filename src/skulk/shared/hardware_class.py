"""A node's canonical hardware class: a short, coarse, anonymous name for the kind of machine
it is (`apple-m4-pro-48gb`, `nvidia-rtx-4090-24gb`, `2x-nvidia-h100-80gb`,
`linux-x86_64-cpu-32gb`), for opt-in field telemetry (`skulk.observe.field_telemetry`).

The class is built from what a probe or a driver says about the hardware (platform, chip
brand, GPU model and memory), never from anything an operator typed: no host name, node
name, address or path can reach it. Memory is snapped to the nearest size machines are
sold with, so the few hundred MiB a kernel or firmware keeps do not split one model of
machine into many classes. Pure: the node computes its own class once per resources
reading and gossips it in `NodeResources.hardware_class`; peers read it from there.

Rules, first that applies wins:
1. Apple Silicon: `apple-<chip>-<ram>gb` (chip from the CPU brand, `silicon` when unknown).
2. NVIDIA GPUs the driver reads: `[<n>x-]nvidia-<model>-<vram>gb`, the model with the
   most VRAM (n: how many of that model the node has, when more than one).
3. Another GPU (AMD, Intel, an NVIDIA the driver cannot read): `<os>-<arch>-<vendor>-gpu-<ram>gb`.
4. Otherwise: `<os>-<arch>-cpu-<ram>gb`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

from skulk.shared.types.node_facts import NodeFacts
from skulk.shared.types.telemetry import GpuReading

MEMORY_SIZES_GB: Final[tuple[int, ...]] = (
    1, 2, 3, 4, 6, 8, 10, 12, 16, 18, 20, 24, 32, 36, 40, 48, 64, 80, 96, 128, 141, 144, 192, 256, 384, 512,
    768, 1024, 1536, 2048, 3072, 4096,
)
"""RAM and VRAM sizes machines and accelerators are sold with (GiB). A reading snaps to the
nearest on a log scale: 23.4 GiB of RAM a Linux kernel reports on a 24 GB box is `24gb`,
an H100's 79.6 GiB is `80gb`."""

MAX_CLASS_LENGTH: Final = 64
"""Longest class accepted (`is_hardware_class`); a longer one is not a class."""

MAX_PART_LENGTH: Final = 32
"""A chip or GPU model name is cut to this many characters once slugged."""

UNKNOWN_HARDWARE: Final = "unknown"
"""The class of a node whose class is not known (it never said, or said something malformed)."""

_CLASS_RE: Final = re.compile(r"^[a-z0-9_]+(?:-[a-z0-9_]+)*$")
_SIZE_WORD_RE: Final = re.compile(r"^\d+(?:gb|gib)$")
"""A memory size inside a model name (`H100 80GB HBM3`): the class states memory once, at the end."""
_VENDOR_WORDS: Final = frozenset({"nvidia", "geforce", "apple", "amd", "intel", "corporation", "tm", "r"})
"""Words dropped from a model name: the vendor leads the class already."""


def memory_gb(size_bytes: int) -> int:
    """`size_bytes` snapped to the nearest size in MEMORY_SIZES_GB (log scale); 0 for none."""
    if size_bytes <= 0:
        return 0
    gib = size_bytes / 2**30
    return min(MEMORY_SIZES_GB, key=lambda size: abs(math.log(size) - math.log(gib)))


def slug(name: str, drop: frozenset[str] = _VENDOR_WORDS) -> str:
    """`name` as lowercase words joined by '-', vendor words and sizes dropped, at most
    MAX_PART_LENGTH characters."""
    words = [w for w in re.split(r"[^a-z0-9_]+", name.lower())
             if w and w not in drop and not _SIZE_WORD_RE.match(w)]
    return "-".join(words)[:MAX_PART_LENGTH].strip("-_")


def _platform(facts: NodeFacts) -> str:
    return f"{slug(facts.os, frozenset()) or 'unknown'}-{slug(facts.machine, frozenset()) or 'unknown'}"


def _apple(facts: NodeFacts, ram_total_bytes: int, _gpus: Sequence[GpuReading]) -> str | None:
    if not facts.is_apple_silicon():
        return None
    chip = slug(facts.cpu_brand or "") or "silicon"
    return f"apple-{chip}-{memory_gb(ram_total_bytes)}gb"


def _nvidia(_facts: NodeFacts, _ram_total_bytes: int, gpus: Sequence[GpuReading]) -> str | None:
    nvidia = [g for g in gpus if g.vendor == "nvidia"]
    if not nvidia:
        return None
    biggest = max(nvidia, key=lambda g: (g.vram_total_bytes, g.name))
    count = sum(1 for g in nvidia if g.name == biggest.name)
    prefix = f"{count}x-" if count > 1 else ""
    model = slug(biggest.name) or "gpu"
    return f"{prefix}nvidia-{model}-{memory_gb(biggest.vram_total_bytes)}gb"


def _other_gpu(facts: NodeFacts, ram_total_bytes: int, _gpus: Sequence[GpuReading]) -> str | None:
    vendors = sorted({g.vendor for g in facts.gpus if g.vendor != "apple"})
    if not vendors:
        return None
    return f"{_platform(facts)}-{vendors[0]}-gpu-{memory_gb(ram_total_bytes)}gb"


def _cpu(facts: NodeFacts, ram_total_bytes: int, _gpus: Sequence[GpuReading]) -> str:
    return f"{_platform(facts)}-cpu-{memory_gb(ram_total_bytes)}gb"


def hardware_class(facts: NodeFacts, ram_total_bytes: int, gpus: Sequence[GpuReading] = ()) -> str:
    """This node's class (see the module docstring for the rules). `gpus` are the driver's
    readings (`NodeResources.gpus`), `facts` the probe's (`skulk.facts.probe`)."""
    found = (
        _apple(facts, ram_total_bytes, gpus)
        or _nvidia(facts, ram_total_bytes, gpus)
        or _other_gpu(facts, ram_total_bytes, gpus)
        or _cpu(facts, ram_total_bytes, gpus)
    )
    return found if is_hardware_class(found) else UNKNOWN_HARDWARE


def is_hardware_class(value: object) -> bool:
    """Whether `value` has a class's shape: lowercase words of [a-z0-9_] joined by '-', at
    most MAX_CLASS_LENGTH. What telemetry checks before it sends a class a peer gossiped."""
    return isinstance(value, str) and len(value) <= MAX_CLASS_LENGTH and _CLASS_RE.match(value) is not None


__all__ = [
    "MAX_CLASS_LENGTH",
    "MEMORY_SIZES_GB",
    "UNKNOWN_HARDWARE",
    "hardware_class",
    "is_hardware_class",
    "memory_gb",
    "slug",
]
