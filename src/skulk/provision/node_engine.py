"""The llama-server this node serves with: the operator's override, else its managed build.

`resolve_llama_server` is read by `skulk engines list`; `export_managed_llama_server` runs
once at node start and, when no override is set, exports the managed binary's path as
SKULK_LLAMA_SERVER_BIN for the process, so the capability probe, the doctor and every
runner this node spawns agree on one binary. An override (even an invalid one) is never
replaced: an invalid override stays a loud `invalid_engine_binary` conflict.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skulk.provision.llama_binary import choose_install, installed_engines
from skulk.shared.types.node_facts import ENGINE_BINARY_ENV

LLAMA_SERVER_ENV = ENGINE_BINARY_ENV["llama_server"]
MANAGED_BACKEND_ENV = "SKULK_LLAMA_SERVER_MANAGED_BACKEND"
"""Set beside an exported managed binary: the backend it was built for, so the probe knows
a CPU build on a GPU node is a CPU build (the binary itself cannot be asked cheaply)."""


@dataclass(frozen=True)
class ResolvedServer:
    path: Path
    source: Literal["override", "managed"]
    backend: str | None
    """The managed build's backend; None for an override (unknown)."""


def _llama_cpp_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def resolve_llama_server(env: Mapping[str, str], engines_dir: Path) -> ResolvedServer | None:
    override = env.get(LLAMA_SERVER_ENV, "").strip()
    if override:
        return ResolvedServer(Path(override).expanduser(), "override", env.get(MANAGED_BACKEND_ENV) or None)
    install = choose_install(installed_engines(engines_dir), _llama_cpp_version())
    if install is None:
        return None
    return ResolvedServer(install.server, "managed", install.backend)


def export_managed_llama_server(env: MutableMapping[str, str], engines_dir: Path) -> ResolvedServer | None:
    """Point SKULK_LLAMA_SERVER_BIN at the managed build unless an override is set."""
    if env.get(LLAMA_SERVER_ENV, "").strip():
        return None
    resolved = resolve_llama_server(env, engines_dir)
    if resolved is not None:
        env[LLAMA_SERVER_ENV] = str(resolved.path)
        env[MANAGED_BACKEND_ENV] = resolved.backend or ""
    return resolved


__all__ = ["LLAMA_SERVER_ENV", "MANAGED_BACKEND_ENV", "ResolvedServer", "export_managed_llama_server", "resolve_llama_server"]
