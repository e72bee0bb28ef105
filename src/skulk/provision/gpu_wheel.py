"""A GPU llama-server without a compiler: xllamacpp's GPU wheels, installed into the machine's
engines dir and served by the bundled `skulk-llama-server`. Pure: which wheel index fits this
machine, where an install lives and the installer's command line; the shell is
`skulk engines install --wheel` (`skulk.cli_engines`).

PyPI carries xllamacpp's CPU (and macOS Metal) wheels, which Skulk depends on. Its CUDA and
Vulkan wheels live on the project's own package indexes, one per CUDA toolkit. A node with an
NVIDIA GPU but no CUDA toolkit (no nvcc: the common case on a desktop or a GPU cloud image)
cannot build llama.cpp for its GPU; installing the wheel of the same xllamacpp version for
the driver's CUDA version gives it llama.cpp's server on the GPU in a minute. The wheel goes
into its own directory (`xllamacpp-<version>-<backend>/site`, with a manifest), never into the
project's environment: `uv sync` cannot undo it, and removing the directory removes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

WHEEL_PACKAGE = "xllamacpp"
WHEEL_INDEX_ROOT = "https://xorbitsai.github.io/xllamacpp/whl"
WHEEL_KIND = "wheel"
"""The manifest's `kind` for a wheel install (a native build's manifest has none)."""
SITE_DIR = "site"

CUDA_LANES: tuple[tuple[tuple[int, int], str], ...] = (((13, 2), "cu132"), ((12, 8), "cu128"))
"""(the CUDA version a driver must support, the index's name), newest first."""
OTHER_LANES: Mapping[str, str] = {"vulkan": "vulkan"}

WHEEL_BACKENDS: tuple[str, ...] = ("cuda", "vulkan")
"""Backends a wheel can provide on Linux."""


def wheel_index(backend: str, driver_cuda: tuple[int, int] | None) -> str | None:
    """The index for `backend` on this machine: for CUDA the newest toolkit the driver
    supports (`driver_cuda`: what NVML reports, e.g. (12, 8)); an unknown driver version gets
    the oldest (broadest) lane. None when no wheel fits."""
    if backend == "cuda":
        if driver_cuda is None:
            return f"{WHEEL_INDEX_ROOT}/{CUDA_LANES[-1][1]}"
        for needed, name in CUDA_LANES:
            if driver_cuda >= needed:
                return f"{WHEEL_INDEX_ROOT}/{name}"
        return None
    lane = OTHER_LANES.get(backend)
    return None if lane is None else f"{WHEEL_INDEX_ROOT}/{lane}"


def cuda_version_of(driver_version: int) -> tuple[int, int]:
    """NVML's CUDA driver version integer (12080) as (12, 8)."""
    return driver_version // 1000, (driver_version % 1000) // 10


def wheel_install_dir(engines_dir: Path, version: str, backend: str) -> Path:
    return engines_dir / f"{WHEEL_PACKAGE}-{version}-{backend}"


@dataclass(frozen=True)
class WheelInstall:
    """A GPU wheel installed into the engines dir."""

    directory: Path
    version: str
    backend: str

    @property
    def site(self) -> Path:
        return self.directory / SITE_DIR


def install_command(installer: Sequence[str], target: Path, index: str, version: str) -> list[str]:
    """The installer's command (`installer`: `uv pip` with this interpreter, or `python -m
    pip`): exactly this xllamacpp version (its server is what `skulk-llama-server` drives),
    from that index only, into `target`, nothing else (the wheel has no dependencies)."""
    return [*installer, "install", "--no-deps", "--target", str(target), "--index-url", index,
            f"{WHEEL_PACKAGE}=={version}"]


def choose_wheel(installs: Sequence[WheelInstall], version: str | None) -> WheelInstall | None:
    """The wheel a node serves with: the running xllamacpp's version, CUDA before Vulkan."""
    matching = [i for i in installs if version is None or i.version == version]
    ranked = sorted(matching, key=lambda i: WHEEL_BACKENDS.index(i.backend) if i.backend in WHEEL_BACKENDS else 99)
    return ranked[0] if ranked else None


__all__ = [
    "CUDA_LANES",
    "SITE_DIR",
    "WHEEL_BACKENDS",
    "WHEEL_KIND",
    "WHEEL_PACKAGE",
    "WheelInstall",
    "choose_wheel",
    "cuda_version_of",
    "install_command",
    "wheel_index",
    "wheel_install_dir",
]
