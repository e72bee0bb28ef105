"""Whether a node builds a native llama-server in the background when it starts, and how that
build's progress reads. Pure: the shell (`skulk.provision.background_install`) observes and
acts.

A fresh node serves GGUF at once with the bundled llama-server (xllamacpp's prebuilt wheel),
but a native build (`skulk engines install`) is compiled for this very CPU (AVX-512 and the
like) or GPU, so it is faster where the wheel is generic. So, unless the operator opts out
(SKULK_NO_ENGINE_AUTOPROVISION=1), names a binary (SKULK_LLAMA_SERVER_BIN), or a build for
this machine's compute is already installed, a node starts that build in the background at
the lowest CPU priority and switches new placements to it when it is ready. Where the build
cannot run (no compiler), the node says so, with the fix, instead of trying and failing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from skulk.provision.gpu_wheel import WHEEL_BACKENDS
from skulk.shared.settings import setting
from skulk.shared.types.telemetry import EngineProvision

AUTOPROVISION_OFF_ENV = "SKULK_NO_ENGINE_AUTOPROVISION"
TRUTHY = frozenset({"1", "true", "yes", "on"})

TOOLCHAIN: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "cpu": (("cmake",), ("c++", "g++", "clang++")),
    "metal": (("cmake",), ("c++", "clang++")),
    "cuda": (("cmake",), ("c++", "g++", "clang++"), ("nvcc",)),
    "vulkan": (("cmake",), ("c++", "g++", "clang++"), ("glslc",)),
}
"""Per backend, the programs a build needs: each entry is alternatives (any one will do)."""

TOOLCHAIN_PACKAGES: Mapping[str, str] = {
    "cpu": "cmake and a C++ compiler (Debian/Ubuntu: apt-get install cmake ninja-build g++)",
    "metal": "cmake and the Xcode command line tools (xcode-select --install; brew install cmake)",
    "cuda": "cmake, a C++ compiler and the CUDA toolkit's nvcc",
    "vulkan": "cmake, a C++ compiler and the Vulkan SDK's glslc",
}


def opted_out(env: Mapping[str, str]) -> bool:
    return setting(AUTOPROVISION_OFF_ENV, env).lower() in TRUTHY


def missing_tools(backend: str, which: Callable[[str], str | None]) -> tuple[str, ...]:
    """The toolchain entries for `backend` of which no alternative is found (by `which`)."""
    return tuple(
        " or ".join(alternatives)
        for alternatives in TOOLCHAIN.get(backend, TOOLCHAIN["cpu"])
        if not any(which(name) for name in alternatives)
    )


@dataclass(frozen=True)
class BuildInBackground:
    backend: str
    wheel: bool = False
    """Install xllamacpp's GPU wheel (`skulk engines install --wheel`) instead of compiling."""


@dataclass(frozen=True)
class NoBuild:
    reason: str
    shown: EngineProvision | None = None
    """What the node reports (a skipped build, with its fix); None: nothing to report."""


def autoprovision_decision(
    env: Mapping[str, str],
    *,
    override: bool,
    worker_enabled: bool,
    backend: str,
    installed_backends: Collection[str],
    missing: Sequence[str],
    wheel_possible: bool = False,
) -> BuildInBackground | NoBuild:
    """Build `backend` in the background, or why not. `installed_backends`: the backends of
    the managed installs (native builds and GPU wheels) that match the running versions;
    `missing`: what `missing_tools` found absent; `override`: the operator named a
    llama-server; `wheel_possible`: a GPU wheel of the bundled server can run here (Linux,
    xllamacpp installed). A GPU lane with a wheel takes the wheel: a minute's download, no
    toolkit, and the wheel is built for GPUs (its CPU code matters little there)."""
    if override:
        return NoBuild("the operator named a llama-server (SKULK_LLAMA_SERVER_BIN)")
    if opted_out(env):
        return NoBuild(f"{AUTOPROVISION_OFF_ENV} is set")
    if not worker_enabled:
        return NoBuild("this node runs no worker")
    if backend in installed_backends:
        return NoBuild(f"a {backend} build is installed")
    if wheel_possible and backend in WHEEL_BACKENDS:
        return BuildInBackground(backend, wheel=True)
    if missing:
        return NoBuild(
            f"no {', '.join(missing)}",
            EngineProvision(
                state="skipped", backend=backend,
                message=f"no native llama-server build: {', '.join(missing)} not found on this machine. "
                f"GGUF is served by the bundled llama-server meanwhile. Install {TOOLCHAIN_PACKAGES.get(backend, '')} "
                f"and restart the node, or run `skulk engines install`; {AUTOPROVISION_OFF_ENV}=1 silences this.",
            ),
        )
    return BuildInBackground(backend)


# -- progress ---------------------------------------------------------------------------------


def progress_line(step: str, done: int, total: int | None) -> str:
    """One line of `skulk engines install --progress json` (read by `provision_after_line`)."""
    return json.dumps({"step": step, "done": done, "total": total})


def provision_after_line(current: EngineProvision, line: str) -> EngineProvision:
    """The build's state after one line of its output; a line that is not progress (a log
    line, a half-written one) changes nothing."""
    try:
        record = json.loads(line)
    except ValueError:
        return current
    if not isinstance(record, dict) or not isinstance(record.get("step"), str):
        return current
    done, total = record.get("done"), record.get("total")
    return current.model_copy(update={
        "step": record["step"],
        "done": done if isinstance(done, int) and done >= 0 else 0,
        "total": total if isinstance(total, int) and total >= 0 else None,
    })


def provision_ended(current: EngineProvision, exit_code: int, installed_at: str | None, tail: str) -> EngineProvision:
    """The build's final state from the install's exit code (and where it installed)."""
    if exit_code == 0 and installed_at:
        return current.model_copy(update={"state": "ready", "step": None, "message": f"installed at {installed_at}"})
    return current.model_copy(update={
        "state": "failed",
        "message": f"the background build failed (exit {exit_code}); GGUF is still served by the bundled "
        f"llama-server. Run `skulk engines install` to see why. {tail}".strip(),
    })


__all__ = [
    "AUTOPROVISION_OFF_ENV",
    "TOOLCHAIN",
    "BuildInBackground",
    "NoBuild",
    "autoprovision_decision",
    "missing_tools",
    "opted_out",
    "progress_line",
    "provision_after_line",
    "provision_ended",
]
