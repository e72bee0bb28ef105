"""The llama-server this node serves with: the operator's override, else its managed build,
else the bundled one.

Precedence, best first:
1. SKULK_LLAMA_SERVER_BIN: an operator's override always wins (even an invalid one, which
   stays a loud `invalid_engine_binary` conflict and is never masked).
2. The GPU before the CPU: a native GPU build, then the bundled server on a GPU wheel
   (`skulk engines install --wheel`), then a native CPU build, then the bundled server on
   the CPU.
3. On one compute, a managed native build (`skulk engines install`) in the machine's
   engines dir before the bundled one: it is compiled for this CPU (AVX-512 and the like).
4. The bundled `skulk-llama-server` (`skulk.worker.engines.served.bundled_server`):
   llama.cpp's own server from the prebuilt xllamacpp wheel, installed with Skulk. It makes
   a fresh node serve many GGUF requests at once with nothing to build.
   SKULK_BUNDLED_LLAMA_SERVER=0 turns it off (the node then serves GGUF in-process, one
   request at a time, until a managed build exists).

`resolve_llama_server` is read by `skulk engines list`; `export_managed_llama_server` runs
once at node start and, when no override is set, exports the chosen binary's path as
SKULK_LLAMA_SERVER_BIN for the process, so the capability probe, the doctor and every
runner this node spawns agree on one binary. `choose_server` is the pure rule.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from skulk.provision.gpu_wheel import WheelInstall, choose_wheel
from skulk.provision.llama_binary import (
    ManagedInstall,
    choose_install,
    installed_engines,
    installed_wheels,
    probe_version,
)
from skulk.shared.settings import setting
from skulk.shared.types.node_facts import ENGINE_BINARY_ENV

LLAMA_SERVER_ENV = ENGINE_BINARY_ENV["llama_server"]
MANAGED_BACKEND_ENV = "SKULK_LLAMA_SERVER_MANAGED_BACKEND"
"""Set beside an exported managed binary: the backend it was built for, so the probe knows
a CPU build on a GPU node is a CPU build (the binary itself cannot be asked cheaply)."""
SOURCE_ENV = "SKULK_LLAMA_SERVER_SOURCE"
"""Set beside an exported binary: 'managed' or 'bundled', so later readers (the background
build, which must never replace an operator's choice) can tell an export from an override."""
SITE_ENV = "SKULK_BUNDLED_LLAMA_SITE"
"""Set beside an exported bundled server that serves from a GPU wheel (`skulk engines install
--wheel`): the directory `skulk-llama-server` imports xllamacpp from."""
BUNDLED_ENV = "SKULK_BUNDLED_LLAMA_SERVER"
"""'0' (or false/no/off): never serve with the bundled llama-server."""
BUNDLED_SCRIPT = "skulk-llama-server"
POOL_RPC_SERVER_ENV = "SKULK_POOL_RPC_SERVER_BIN"
"""The ggml RPC server a pool donor lends this node's compute through. Exported at node start
(and when a background build lands) as the managed build's `ggml-rpc-server` when there is
one: built from the llama.cpp that llama-cpp-python vendors (so it speaks the driver's RPC
protocol), for this CPU or GPU, so a pooled GPU box computes on its GPU. Unset: the donor
serves the CPU from llama-cpp-python's own libraries, in-process. An operator's value is
never replaced."""
POOL_RPC_SOURCE_ENV = "SKULK_POOL_RPC_SERVER_SOURCE"
"""'managed' beside an exported POOL_RPC_SERVER_ENV: an export, not an operator's choice."""

ServerSource = Literal["override", "managed", "bundled"]


@dataclass(frozen=True)
class ResolvedServer:
    path: Path
    source: ServerSource
    backend: str | None
    """The managed or bundled build's compute; None for an override (unknown)."""
    site: Path | None = None
    """For a bundled server on a GPU wheel: where that wheel is installed."""


@dataclass(frozen=True)
class BundledServer:
    path: Path
    backend: str
    site: Path | None = None
    """The GPU wheel's directory, None for the xllamacpp installed with Skulk."""


def bundled_allowed(env: Mapping[str, str]) -> bool:
    return setting(BUNDLED_ENV, env).lower() not in ("0", "false", "no", "off")


def choose_server(env: Mapping[str, str], managed: ManagedInstall | None,
                  bundled: BundledServer | None) -> ResolvedServer | None:
    """The operator's override; else the GPU before the CPU, and on one compute the native
    build before the bundled server (when allowed): a CUDA wheel beats a native CPU build."""
    override = setting(LLAMA_SERVER_ENV, env)
    if override:
        return ResolvedServer(Path(override).expanduser(), "override", setting(MANAGED_BACKEND_ENV, env) or None)
    candidates: list[ResolvedServer] = []
    if managed is not None:
        candidates.append(ResolvedServer(managed.server, "managed", managed.backend))
    if bundled is not None and bundled_allowed(env):
        candidates.append(ResolvedServer(bundled.path, "bundled", bundled.backend, bundled.site))
    ranked = sorted(candidates, key=lambda c: (c.backend == "cpu", c.source != "managed"))
    return ranked[0] if ranked else None


def llama_cpp_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def managed_install(engines_dirs: Sequence[Path]) -> ManagedInstall | None:
    installs = [install for directory in engines_dirs for install in installed_engines(directory)]
    return choose_install(installs, llama_cpp_version())


def xllamacpp_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xllamacpp")
    except PackageNotFoundError:
        return None


def find_bundled_server(engines_dirs: Sequence[Path] = ()) -> BundledServer | None:
    """The bundled server's console script beside this interpreter, when xllamacpp is
    installed and the script answers `--version` (which names the wheel's compute): on a GPU
    wheel installed in `engines_dirs` when one answers with its GPU, else on the xllamacpp
    installed with Skulk."""
    from skulk.provision.bundled_report import backend_of_report

    if find_spec("xllamacpp") is None:
        return None
    script = Path(sys.executable).parent / BUNDLED_SCRIPT
    if not script.is_file():
        return None
    wheels = [wheel for directory in engines_dirs for wheel in installed_wheels(directory)]
    wheel = choose_wheel(wheels, xllamacpp_version())
    if wheel is not None:
        backend = backend_of_report(probe_version(script, env={**os.environ, SITE_ENV: str(wheel.site)}))
        if backend is not None and backend != "cpu":
            return BundledServer(script, backend, wheel.site)
    backend = backend_of_report(probe_version(script, env={k: v for k, v in os.environ.items() if k != SITE_ENV}))
    return None if backend is None else BundledServer(script, backend)


def resolve_llama_server(env: Mapping[str, str], engines_dirs: Sequence[Path]) -> ResolvedServer | None:
    if setting(LLAMA_SERVER_ENV, env):
        return choose_server(env, None, None)
    managed = managed_install(engines_dirs)
    gpu_native = managed is not None and managed.backend != "cpu"
    bundled = None if gpu_native or not bundled_allowed(env) else find_bundled_server(engines_dirs)
    return choose_server(env, managed, bundled)


def pool_rpc_server(managed: ManagedInstall | None) -> Path | None:
    """The managed build's ggml-rpc-server, when it has one."""
    return managed.rpc_server if managed is not None and managed.rpc_server.is_file() else None


def export_pool_rpc_server(env: MutableMapping[str, str], managed: ManagedInstall | None) -> bool:
    """Point POOL_RPC_SERVER_ENV at `managed`'s ggml-rpc-server, unless the operator set it
    or an earlier export stands (a CPU build never replaces one; a GPU build replaces a CPU
    one). True when `env` changed."""
    server = pool_rpc_server(managed)
    current = setting(POOL_RPC_SERVER_ENV, env)
    if server is None or managed is None or (current and setting(POOL_RPC_SOURCE_ENV, env) != "managed"):
        return False
    if current and (managed.backend == "cpu" or current == str(server)):
        return False
    env[POOL_RPC_SERVER_ENV] = str(server)
    env[POOL_RPC_SOURCE_ENV] = "managed"
    return True


def export_managed_llama_server(env: MutableMapping[str, str], engines_dirs: Sequence[Path]) -> ResolvedServer | None:
    """Point SKULK_LLAMA_SERVER_BIN at the managed or bundled build unless an override is set,
    and a pool donor's RPC server at the managed build's (`export_pool_rpc_server`)."""
    export_pool_rpc_server(env, managed_install(engines_dirs))
    if setting(LLAMA_SERVER_ENV, env):
        return None
    resolved = resolve_llama_server(env, engines_dirs)
    if resolved is not None:
        env[LLAMA_SERVER_ENV] = str(resolved.path)
        env[MANAGED_BACKEND_ENV] = resolved.backend or ""
        env[SOURCE_ENV] = resolved.source
        _set_site(env, resolved.site)
    return resolved


def _set_site(env: MutableMapping[str, str], site: Path | None) -> None:
    if site is None:
        env.pop(SITE_ENV, None)
    else:
        env[SITE_ENV] = str(site)


def server_source(env: Mapping[str, str]) -> ServerSource | None:
    """Where the llama-server in `env` came from: None when there is none."""
    if not setting(LLAMA_SERVER_ENV, env):
        return None
    source = setting(SOURCE_ENV, env)
    return source if source in ("managed", "bundled") else "override"  # type: ignore[return-value]


def adopt_install(env: MutableMapping[str, str], install: ManagedInstall | WheelInstall) -> bool:
    """Point the node at a build that became ready while it ran (the background build: a
    native one, or a GPU wheel for the bundled server), unless the operator named a binary or
    the node serves on a GPU and the build is for the CPU. True when `env` changed."""
    pool_changed = isinstance(install, ManagedInstall) and export_pool_rpc_server(env, install)
    if server_source(env) == "override":
        return pool_changed
    if install.backend == "cpu" and setting(MANAGED_BACKEND_ENV, env) not in ("", "cpu"):
        return pool_changed
    if isinstance(install, WheelInstall):
        env[LLAMA_SERVER_ENV] = str(Path(sys.executable).parent / BUNDLED_SCRIPT)
        env[SOURCE_ENV] = "bundled"
        _set_site(env, install.site)
    else:
        env[LLAMA_SERVER_ENV] = str(install.server)
        env[SOURCE_ENV] = "managed"
        _set_site(env, None)
    env[MANAGED_BACKEND_ENV] = install.backend
    return True


__all__ = [
    "BUNDLED_ENV",
    "LLAMA_SERVER_ENV",
    "MANAGED_BACKEND_ENV",
    "POOL_RPC_SERVER_ENV",
    "POOL_RPC_SOURCE_ENV",
    "SITE_ENV",
    "SOURCE_ENV",
    "BundledServer",
    "ResolvedServer",
    "adopt_install",
    "bundled_allowed",
    "choose_server",
    "export_managed_llama_server",
    "export_pool_rpc_server",
    "find_bundled_server",
    "managed_install",
    "pool_rpc_server",
    "resolve_llama_server",
    "server_source",
]
