"""One probe pass over this machine: the impure half of capability detection.

`probe_node_facts` reads the platform, which engine packages import, what the llama.cpp
build reports about GPU offload, every GPU visible through NVML, a bare /dev/nvidiaN node,
DRM sysfs or the Apple platform, the state of every configured engine binary, and the
serving-relevant SKULK_* declarations. It records observations only; turning them into
advertised backend tags is `skulk.facts.derive` (pure).

It must never raise: each probe step is isolated, and a step that fails contributes what it
could (an unreadable NVML leaves the device-node GPU; an unimportable llama_cpp leaves
`llama_cpp_gpu_offload` None). It must never record a secret: declarations come from an
allowlist of serving knobs, so SKULK_CLUSTER_KEY and friends are never captured.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from skulk.provision.llama_binary import probe_version
from skulk.provision.node_engine import MANAGED_BACKEND_ENV
from skulk.shared.settings import setting
from skulk.shared.types.engines import traits_of
from skulk.shared.types.node_facts import (
    ENGINE_BINARY_ENV,
    PROBED_MODULES,
    EngineBinary,
    EngineBinaryState,
    GpuFact,
    GpuVendor,
    NodeFacts,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

DECLARATION_PATTERN = re.compile(r"^SKULK_[A-Z0-9_]+_(BACKENDS|BIN)$")
"""Env vars that declare a node's serving capability: SKULK_<ENGINE>_BACKENDS and
SKULK_<ENGINE>_BIN. Captured verbatim."""

DECLARATION_NAMES: frozenset[str] = frozenset(
    {
        "SKULK_LLAMA_CPP_FLASH_ATTN",
        "SKULK_LLAMA_SERVER_PARALLEL",
        "SKULK_VLLM_MAX_CONCURRENT_REQUESTS",
        "SKULK_NO_ENGINE_AUTOPROVISION",
        "SKULK_ENGINES_DIR",
    }
)
"""Other serving knobs worth showing beside the derived backends (doctor, diagnostics)."""

PCI_VENDORS: dict[str, GpuVendor] = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}
"""PCI vendor ids as /sys/class/drm/cardN/device/vendor spells them."""

_NVIDIA_DEVICE_RE = re.compile(r"^nvidia(\d+)$")
_DRM_CARD_RE = re.compile(r"^card(\d+)$")


def probe_node_facts(env: Mapping[str, str] = os.environ, *, fs_root: Path = Path("/")) -> NodeFacts:
    """Observe this node. Never raises. `fs_root` relocates /dev and /sys (tests)."""
    system, machine = _platform()
    importable = {name: _importable(name) for name in PROBED_MODULES}
    return NodeFacts(
        os=system,
        machine=machine,
        cpu_brand=_step("cpu brand", lambda: _cpu_brand(system), None),
        gpus=_step("gpus", lambda: _gpus(system, machine, fs_root), []),
        importable=importable,
        llama_cpp_gpu_offload=_llama_cpp_gpu_offload() if importable.get("llama_cpp") else None,
        engine_binaries=_step("engine binaries", lambda: _engine_binaries(env), {}),
        declarations=_step("declarations", lambda: _declarations(env), {}),
    )


def _step(what: str, probe: Callable[[], T], fallback: T) -> T:
    """Run one probe step; a bug or an odd machine costs that step only, never the pass."""
    try:
        return probe()
    except Exception as exc:
        log.warning("node probe step %r failed, recording nothing for it: %s", what, exc)
        return fallback


# -- steps, each isolated ------------------------------------------------------------------


def _platform() -> tuple[str, str]:
    try:
        return platform.system().lower() or "unknown", platform.machine().lower() or "unknown"
    except Exception:  # pragma: no cover - platform is stdlib and total in practice
        return "unknown", "unknown"


CPU_BRAND_DEADLINE_S = 2.0
"""Longest the `sysctl` that names a Mac's chip may take (it answers in milliseconds)."""


def _cpu_brand(system: str) -> str | None:
    """The CPU brand string on macOS ('Apple M4 Pro'); None elsewhere or when unreadable."""
    if system != "darwin":
        return None
    try:
        done = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=CPU_BRAND_DEADLINE_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    brand = done.stdout.strip()
    return brand[:128] if done.returncode == 0 and brand else None


def _importable(name: str) -> bool:
    # find_spec, not import: importing mlx or llama_cpp loads native libraries; this only
    # needs to know whether they are installed.
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _llama_cpp_gpu_offload() -> bool | None:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception as exc:
        log.warning("llama_cpp imports but its GPU offload report failed: %s", exc)
        return None


def _gpus(system: str, machine: str, root: Path) -> list[GpuFact]:
    gpus: list[GpuFact] = []
    if system == "darwin" and machine in ("arm64", "aarch64"):
        gpus.append(GpuFact(vendor="apple", name="Apple Silicon GPU", detected_by="apple_platform"))
    nvml = _nvml_gpus()
    gpus.extend(nvml if nvml is not None else _nvidia_device_nodes(root))
    have_nvidia = any(g.vendor == "nvidia" for g in gpus)
    gpus.extend(g for g in _drm_gpus(root) if not (have_nvidia and g.vendor == "nvidia"))
    return gpus


def _nvml_gpus() -> list[GpuFact] | None:
    """Every GPU NVML can read, or None when NVML is not installed or cannot initialise."""
    try:
        if importlib.util.find_spec("pynvml") is None:
            return None
        import pynvml  # nvidia-ml-py; optional, so imported only here
    except Exception:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        log.info("NVML did not initialise: %s", exc)
        return None
    gpus: list[GpuFact] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(GpuFact(vendor="nvidia", name=str(name), vram_total_bytes=total, detected_by="nvml"))
    except Exception as exc:
        log.info("NVML failed while reading devices: %s", exc)
        return None  # partial NVML reads fall back to device nodes, which say "degraded"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus


def _nvidia_device_nodes(root: Path) -> list[GpuFact]:
    try:
        names = sorted(
            (int(m.group(1)), entry.name)
            for entry in (root / "dev").iterdir()
            if (m := _NVIDIA_DEVICE_RE.match(entry.name))
        )
    except OSError:
        return []
    return [GpuFact(vendor="nvidia", name=f"NVIDIA GPU /dev/{name}", detected_by="device_node") for _, name in names]


def _drm_gpus(root: Path) -> list[GpuFact]:
    drm = root / "sys" / "class" / "drm"
    try:
        cards = sorted((int(m.group(1)), entry) for entry in drm.iterdir() if (m := _DRM_CARD_RE.match(entry.name)))
    except OSError:
        return []
    gpus: list[GpuFact] = []
    for _, card in cards:
        vendor = PCI_VENDORS.get(_read_text(card / "device" / "vendor").lower())
        if vendor is None:
            continue
        device_id = _read_text(card / "device" / "device")
        vram = _read_int(card / "device" / "mem_info_vram_total")  # amdgpu only
        name = f"{vendor.upper()} GPU {card.name}" + (f" ({device_id})" if device_id else "")
        gpus.append(GpuFact(vendor=vendor, name=name, vram_total_bytes=vram, detected_by="sysfs"))
    return gpus


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text) if text.isdigit() else None


def _engine_binaries(env: Mapping[str, str]) -> dict[str, EngineBinary]:
    binaries: dict[str, EngineBinary] = {}
    for engine, var in ENGINE_BINARY_ENV.items():
        value = setting(var, env)
        if not value:
            continue
        state = _binary_state(value, env)
        version = None
        if state == "usable":
            path = os.path.expanduser(value.strip())
            version = probe_version(shutil.which(path, path=env.get("PATH")) or path if os.sep not in path else path)
            state = "usable" if version is not None else "broken"
        backend = setting(MANAGED_BACKEND_ENV, env) or None if traits_of(engine).managed_build else None
        binaries[engine] = EngineBinary(path=value, state=state, version=version, backend=backend)
    return binaries


def _binary_state(value: str, env: Mapping[str, str]) -> EngineBinaryState:
    try:
        path = os.path.expanduser(value.strip())
        if os.sep not in path:  # a bare command name resolves on PATH
            found = shutil.which(path, path=env.get("PATH"))
            if found is None:
                return "missing"
            path = found
        if not os.path.exists(path):
            return "missing"
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            return "not_executable"
        return "usable"
    except (OSError, ValueError):
        return "missing"


def _declarations(env: Mapping[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in sorted(env.items())
        if key in DECLARATION_NAMES or DECLARATION_PATTERN.match(key)
    }


__all__ = ["DECLARATION_NAMES", "DECLARATION_PATTERN", "PCI_VENDORS", "probe_node_facts"]
