"""What the bundled llama-server (`skulk-llama-server`) says of itself, and how it is read.

The bundled server answers `--version` with one line in llama-server's `version:` shape that
also names the compute its wheel serves on (cpu for PyPI's CPU wheel; cuda, rocm, vulkan
or metal for a GPU wheel that sees its device). The node reads that line once at start
(`skulk.provision.node_engine`) to advertise the right backend tag. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GPU_BACKEND_OF_DEVICE: tuple[tuple[str, str], ...] = (
    ("cuda", "cuda"), ("rocm", "rocm"), ("hip", "rocm"), ("vulkan", "vulkan"), ("metal", "metal"), ("mtl", "metal"),
)
"""A GPU device name's prefix (lowercased) as ggml names its backends' devices -> compute."""


def backend_of_devices(devices: Sequence[Mapping[str, Any]]) -> str:
    """The compute the wheel serves on: its first GPU device's backend, else cpu (a CPU
    wheel on a GPU box, or a GPU wheel without a usable driver, computes on the CPU)."""
    for device in devices:
        kind = str(device.get("type", "")).lower()
        if "gpu" not in kind:
            continue
        name = str(device.get("name", "")).lower()
        for prefix, backend in GPU_BACKEND_OF_DEVICE:
            if name.startswith(prefix):
                return backend
    return "cpu"


REPORT_BACKEND_MARK = "backend "


def version_report(package_version: str, backend: str) -> str:
    """The `--version` line: llama-server's `version:` shape, naming the wheel and its compute."""
    return f"version: xllamacpp {package_version} (llama.cpp server, bundled; {REPORT_BACKEND_MARK}{backend})"


def backend_of_report(report: str | None) -> str | None:
    """The compute a `version_report` line names; None for any other report."""
    if not report or "bundled;" not in report or REPORT_BACKEND_MARK not in report:
        return None
    return report.rsplit(REPORT_BACKEND_MARK, 1)[1].rstrip(")").strip() or None



__all__ = ["GPU_BACKEND_OF_DEVICE", "backend_of_devices", "backend_of_report", "version_report"]
