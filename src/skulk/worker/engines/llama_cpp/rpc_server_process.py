"""A pool donor's ggml RPC server as a process of its own: the managed build's
`ggml-rpc-server` (`SKULK_POOL_RPC_SERVER_BIN`, exported by the node when a managed build
exists, `provision/node_engine.py`).

The in-process server (`skulk.pool.rpc.start_server`) can only lend what llama-cpp-python's
own libraries were built for, which on a wheel install is the CPU. The managed build is
compiled from the same llama.cpp (so it speaks the driver's RPC protocol) for this machine's
CPU or GPU, so a pooled GPU box computes on its GPU. Like the in-process one it listens on
127.0.0.1 only, behind the donor's authenticated gate (`skulk.pool.channel.DonorGate`).

It is a `ServerProcess` (served/process.py): its own process group, SIGKILLed by the kernel
when the runner dies (PR_SET_PDEATHSIG), stopped with the engine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from skulk.provision.node_engine import POOL_RPC_SERVER_ENV
from skulk.shared.settings import setting
from skulk.worker.engines.served.process import (
    HEALTH_POLL_S,
    ServerBinaryMissing,
    ServerProcess,
    ServerStartFailed,
    free_loopback_port,
    owns_port,
)

RPC_READY_DEADLINE_S = 30.0
"""How long the server may take to listen (it loads no model: it starts in milliseconds,
a GPU build initialising its devices in a second or two)."""
START_ATTEMPTS = 3
"""Fresh ports tried when the server exits while starting (a port taken between choosing it
and binding it)."""


def configured_rpc_server() -> str | None:
    """The RPC server binary this runner's donor should start, or None (in-process)."""
    return setting(POOL_RPC_SERVER_ENV) or None


def rpc_server_argv(binary: str, port: int, n_threads: int, cache: bool) -> list[str]:
    """Loopback only; `-c`: llama.cpp's RPC tensor cache (under LLAMA_CACHE)."""
    return [binary, "-H", "127.0.0.1", "-p", str(port), "-t", str(n_threads), *(["-c"] if cache else [])]


def start_rpc_server_process(binary: str, n_threads: int, cache_dir: str | None) -> ServerProcess:
    """Start `binary` on a free loopback port; return it once it listens there (and nobody
    else does). Raises ServerBinaryMissing / ServerStartFailed (both ModelLoadFailed)."""
    path = Path(binary).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ServerBinaryMissing(f"the pool's RPC server {path} ({POOL_RPC_SERVER_ENV}) is missing or not executable; "
                                  "run `skulk engines install`, or unset it to serve the CPU in-process")
    env = {**os.environ, **({"LLAMA_CACHE": cache_dir} if cache_dir else {})}
    tail = ""
    for _attempt in range(START_ATTEMPTS):
        port = free_loopback_port()
        server = ServerProcess(rpc_server_argv(str(path), port, n_threads, cache_dir is not None), env, port)
        deadline = time.monotonic() + RPC_READY_DEADLINE_S
        while server.alive() and time.monotonic() < deadline:
            if _listening(port) and owns_port(server.pid, port) is not False:
                return server
            time.sleep(HEALTH_POLL_S)
        tail = server.log_tail()
        server.stop()
        if time.monotonic() >= deadline:
            break
    raise ServerStartFailed(f"{path.name} did not listen on 127.0.0.1 within {RPC_READY_DEADLINE_S:g}s:\n{tail}")


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


__all__ = ["RPC_READY_DEADLINE_S", "configured_rpc_server", "rpc_server_argv", "start_rpc_server_process"]
