"""Finding the llama-server binary the served-engine tests run against, and its processes.

A node with nothing built serves with the bundled `skulk-llama-server` (llama.cpp's server
from the xllamacpp wheel, installed with the project). `.ci/run` also builds a native one
(`skulk engines install --backend cpu`, cached under ~/.cache/skulk). `find_llama_server`
prefers, as a node does: an explicit SKULK_LLAMA_SERVER_BIN, a managed install, the build
cache of the llama-cpp-python version installed here, then the bundled server. The tests
skip, naming how to get one, only when none answers."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest

from skulk.datadir.paths import resolve_paths
from skulk.provision.llama_binary import probe_version
from skulk.provision.llama_build import RPC_BINARY, SERVER_BINARY, build_cache_root, engine_search_dirs
from skulk.provision.node_engine import find_bundled_server, managed_install

HOW_TO_GET_ONE = "no llama-server binary: run `uv run skulk engines install --backend cpu` (or set SKULK_LLAMA_SERVER_BIN)"


def find_native_llama_server() -> Path | None:
    """A native (compiled) llama-server: override, managed install or build cache."""
    candidates: list[Path] = []
    if os.environ.get("SKULK_LLAMA_SERVER_BIN"):
        candidates.append(Path(os.environ["SKULK_LLAMA_SERVER_BIN"]).expanduser())
    data_home = resolve_paths(os.environ, sys.platform, Path.home()).data_home
    install = managed_install(engine_search_dirs(os.environ, Path.home(), data_home))
    if install is not None:
        candidates.append(install.server)
    candidates.append(build_cache_root(os.environ, Path.home()) / f"{version('llama-cpp-python')}-cpu" / "build" / "bin" / SERVER_BINARY)
    return next((c for c in candidates if c.is_file() and probe_version(c) is not None), None)


def find_native_rpc_server() -> Path | None:
    """The ggml-rpc-server built beside the native llama-server (a pool donor's managed one)."""
    server = find_native_llama_server()
    rpc = None if server is None else server.parent / RPC_BINARY
    return rpc if rpc is not None and rpc.is_file() else None


def require_native_rpc_server() -> Path:
    found = find_native_rpc_server()
    if found is None:
        pytest.skip("no native ggml-rpc-server: run `uv run skulk engines install --backend cpu`")
    return found


def find_llama_server() -> Path | None:
    native = find_native_llama_server()
    if native is not None:
        return native
    bundled = find_bundled_server()
    return None if bundled is None else bundled.path


def require_llama_server() -> Path:
    found = find_llama_server()
    if found is None:
        pytest.skip(HOW_TO_GET_ONE)
    return found


def require_bundled_server() -> Path:
    bundled = find_bundled_server()
    if bundled is None:
        pytest.skip("the bundled llama-server (xllamacpp) is not installed on this platform")
    return bundled.path


def is_llama_server(process: psutil.Process) -> bool:
    """A native build runs as `llama-server`; the bundled one as `python .../skulk-llama-server`."""
    try:
        return any(Path(arg).name.endswith("llama-server") for arg in process.cmdline()[:2])
    except psutil.Error:
        return False


def llama_servers_under(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if is_llama_server(p)]
