"""NodeFacts: what one probe pass observed about this machine, before any interpretation.

The record is the single input of `skulk.facts.derive.derive_node_backends` (and of the
doctor's checks): every GPU the node can see and how it was seen, which engine packages
import, what the llama.cpp build itself reports, the state of every configured engine
binary, and the operator's raw serving declarations. Facts are observations, never
decisions: this module must never decide which backends a node advertises, and nothing here
does I/O (the probe in `skulk.facts.probe` fills it in).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import NonNegInt
from skulk.shared.types.engines import ENGINE_BINARY_ENV as _ENGINE_BINARY_ENV
from skulk.shared.types.engines import PROBED_MODULES as _PROBED_MODULES

GpuVendor = Literal["nvidia", "amd", "apple", "intel"]

GpuDetectedBy = Literal["nvml", "device_node", "sysfs", "apple_platform"]
"""How a GPU was seen. nvml: the NVIDIA management library read it fully (name, VRAM);
device_node: only a /dev/nvidiaN node exists (driver present, NVML unreadable); sysfs: a DRM
card's PCI vendor id under /sys/class/drm; apple_platform: macOS on Apple Silicon."""

EngineBinaryState = Literal["usable", "missing", "not_executable", "broken"]
"""broken: an executable file that does not answer `--version` (a wrong architecture, a
missing shared library, a truncated copy)."""

# Both derive from the engine traits table (one fact, one place); re-exported here where
# the probes and provisioning read them.
PROBED_MODULES: tuple[str, ...] = _PROBED_MODULES
ENGINE_BINARY_ENV: Mapping[str, str] = _ENGINE_BINARY_ENV


class GpuFact(WireModel):
    vendor: GpuVendor
    name: str
    vram_total_bytes: NonNegInt | None = None
    """Dedicated VRAM as the driver reports it; None when unknown or unified (Apple)."""
    detected_by: GpuDetectedBy


class EngineBinary(WireModel):
    """An engine binary an operator pointed at (e.g. SKULK_LLAMA_SERVER_BIN)."""

    path: str
    state: EngineBinaryState
    version: str | None = None
    """What the binary answered to `--version` (usable binaries only)."""
    backend: str | None = None
    """The compute a managed build was made for ('cpu', 'cuda', ...); None when unknown."""


class NodeFacts(WireModel):
    os: str
    """platform.system(), lowercased: 'linux', 'darwin', 'windows'."""
    machine: str
    """platform.machine(), lowercased: 'x86_64', 'arm64', 'aarch64'."""
    cpu_brand: str | None = None
    """The CPU's brand string as the OS reports it ('Apple M4 Pro'); read on macOS only, where
    it names the Apple Silicon chip (`skulk.shared.hardware_class`). None elsewhere."""
    gpus: list[GpuFact] = Field(default_factory=list)
    importable: dict[str, bool] = Field(default_factory=dict)
    """Module name ('llama_cpp', 'mlx', 'mlx_lm', ...) -> whether `find_spec` found it."""
    llama_cpp_gpu_offload: bool | None = None
    """llama_cpp.llama_supports_gpu_offload(): the build's own word on GPU offload. None when
    llama_cpp does not import or the call failed. A build with GGML_RPC also reports True on
    a GPU-less box (RPC counts as an offload device), so True alone never names a GPU."""
    engine_binaries: dict[str, EngineBinary] = Field(default_factory=dict)
    """Engine name ('llama_server', 'vllm') -> the configured binary and its state. Only
    engines whose binary env var is set appear."""
    declarations: dict[str, str] = Field(default_factory=dict)
    """Serving-relevant SKULK_* environment variables, verbatim (never secrets)."""

    def is_apple_silicon(self) -> bool:
        return self.os == "darwin" and self.machine in ("arm64", "aarch64")

    def gpu_vendors(self) -> list[GpuVendor]:
        """Distinct vendors of the visible GPUs, in first-seen order."""
        return list(dict.fromkeys(g.vendor for g in self.gpus))


__all__ = [
    "ENGINE_BINARY_ENV",
    "PROBED_MODULES",
    "EngineBinary",
    "EngineBinaryState",
    "GpuDetectedBy",
    "GpuFact",
    "GpuVendor",
    "NodeFacts",
]
