"""The two halves of a llama.cpp pool inside runner processes (`skulk.pool`).

`PoolDriver` is what rank 0's in-process llama.cpp engine adds when its instance spans
nodes: one `DriverLink` per donor (an authenticated channel to the donor's gate), the RPC
devices registered on those links' loopback endpoints, and the device list and split that
put each donor's layers on its device. `PoolDonorEngine` is every other rank: a ggml RPC
server on 127.0.0.1 behind a `DonorGate`; it serves no requests itself.

A lost donor is fatal to the driver (its model is missing layers): the link calls the
engine's fatal handler with a typed error naming the node and rank, before llama.cpp sees
the closed socket (ggml's RPC client aborts the process on one). The runner then ends every
open stream with that error, reports Failed, and exits; the master's repair re-places the
instance on the survivors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from skulk.pool import rpc
from skulk.pool.channel import ChannelRefused, DonorGate, DriverLink, Remote
from skulk.pool.layout import PoolLayoutError, channel_key, device_split, donor_host, donors, pool_port
from skulk.shared.settings import setting
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import EngineError, GeneratedToken, ModelLoadFailed, ShardSpec
from skulk.worker.engines.llama_cpp.rpc_server_process import configured_rpc_server, start_rpc_server_process
from skulk.worker.engines.served.process import ServerProcess

log = logging.getLogger(__name__)

DONOR_CONNECT_DEADLINE_S = float(setting("SKULK_POOL_CONNECT_DEADLINE_SECONDS") or "120")
"""How long the driver waits for every donor's gate to accept it (donors load concurrently
with the driver). Past it the driver fails to load, naming the donors it could not reach."""
PROBE_INTERVAL_S = 0.25
ENCRYPT_ENV = "SKULK_POOL_ENCRYPT"
"""'0' carries pool bytes authenticated but unencrypted (see README: measured cost)."""
TENSOR_CACHE_ENV = "SKULK_POOL_TENSOR_CACHE_DIR"
"""A directory for a donor's llama.cpp RPC tensor cache (off when unset): a re-load of the
same model (a repair, a re-placement) then ships only hashes of its large tensors instead of
the weights. Opt-in because nothing bounds or evicts it: it keeps a second copy of every
donor share ever loaded."""


def tensor_cache_dir() -> str | None:
    path = setting(TENSOR_CACHE_ENV)
    if not path:
        return None
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path

FatalHandler = Callable[[str, str], None]


class PoolMemberLost(EngineError):
    """A donor of this pool went away: its node died, its runner was killed, or its channel
    failed. The message names the node and rank."""

    error_type = "PoolMemberLost"


def encrypt_enabled() -> bool:
    return setting(ENCRYPT_ENV) != "0"


@contextlib.contextmanager
def _placed_on(devices: list[int]) -> Iterator[None]:
    """`rpc.model_devices`, its refusal as the load failure it is."""
    try:
        with rpc.model_devices(devices):
            yield
    except rpc.DevicesNotApplied as exc:
        raise ModelLoadFailed(f"pool driver: {exc}") from exc


def _require_key(spec: ShardSpec) -> bytes:
    if not spec.pool_key:
        raise ModelLoadFailed("a pooled instance needs the cluster's pool key, and this runner was given none")
    return spec.pool_key


class PoolDriver:
    """Rank 0's side of a pool: links to every donor, and the llama.cpp options that use them."""

    def __init__(self, spec: ShardSpec, on_fatal: Callable[[str, str], None]) -> None:
        self._spec = spec
        self._on_fatal = on_fatal
        self._links: list[DriverLink] = []
        self._closing = threading.Event()
        self._lost = threading.Event()

    def connect(self) -> None:
        """Open a link per donor and wait (bounded) until every donor's gate accepts us."""
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        key = _require_key(self._spec)
        instance = self._spec.instance
        try:
            members = donors(instance)
        except PoolLayoutError as exc:
            raise ModelLoadFailed(str(exc)) from exc
        encrypt = encrypt_enabled()
        for donor in members:
            remote = Remote(donor.host, donor.port, f"node {donor.node_id} (rank {donor.rank})")
            link = DriverLink(remote, channel_key(key, instance, donor.rank), self._lost_member, encrypt=encrypt)
            link.start()
            self._links.append(link)
        deadline = time.monotonic() + DONOR_CONNECT_DEADLINE_S
        waiting = list(self._links)
        last: dict[str, str] = {}
        while waiting:
            for link in list(waiting):
                try:
                    link.probe()
                    waiting.remove(link)
                except (OSError, ChannelRefused) as exc:
                    last[link.remote.name] = str(exc)
            if waiting and time.monotonic() > deadline:
                names = "; ".join(f"{link.remote.name} at {link.remote.host}:{link.remote.port}: "
                                  f"{last.get(link.remote.name)}" for link in waiting)
                raise ModelLoadFailed(f"pool donors unreachable after {DONOR_CONNECT_DEADLINE_S:.0f}s: {names}")
            if waiting:
                time.sleep(PROBE_INTERVAL_S)

    def options(self, num_layers: int) -> tuple[dict[str, Any], AbstractContextManager[None]]:
        """llama_cpp.Llama keyword overrides and the context in which to construct it."""
        remote_devices = rpc.add_servers([link.endpoint for link in self._links])
        own = rpc.local_accelerators() if not self._spec.shard.backend.endswith("-cpu") else []
        split = device_split(self._spec.instance.shards, num_layers, driver_device=bool(own))
        devices = [*own[:1], *remote_devices]
        log.info("pool driver: %d donor device(s), n_gpu_layers=%d, tensor_split=%s",
                 len(remote_devices), split.n_gpu_layers, split.tensor_split)
        return ({"n_gpu_layers": split.n_gpu_layers, "tensor_split": list(split.tensor_split)},
                _placed_on(devices))

    def _lost_member(self, remote: Remote, reason: str) -> None:
        if self._closing.is_set() or self._lost.is_set():
            return
        self._lost.set()
        message = (f"pool member {remote.name} was lost ({reason}); this instance cannot serve "
                   "and is being re-placed")
        log.critical("pool driver: %s", message)
        self._on_fatal(PoolMemberLost.error_type, message)

    def close_pending(self) -> None:
        """The engine is shutting down: a link ending from now on is not a loss."""
        self._closing.set()

    def close(self) -> None:
        self._closing.set()
        for link in self._links:
            link.close()


class PoolDonorEngine:
    """`Engine` for ranks 1..n of a pool: lends this node's memory and compute through a
    loopback ggml RPC server, reachable only through its authenticated gate. The server is
    the managed build's `ggml-rpc-server` when the node exported one (its CPU or GPU,
    `rpc_server_process.py`), else llama-cpp-python's own, in-process (the CPU)."""

    def __init__(self) -> None:
        self._gate: DonorGate | None = None
        self._server: ServerProcess | None = None
        self.rpc_port: int | None = None

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def in_flight(self) -> int:
        return 0

    @property
    def gate(self) -> DonorGate | None:
        return self._gate

    def load(self, spec: ShardSpec) -> None:
        shard = spec.shard
        if shard.rank == 0:
            raise ModelLoadFailed("rank 0 of a pool is its driver, not a donor")
        key = _require_key(spec)
        try:
            host = donor_host(spec.instance, shard.rank)
            port = pool_port(spec.instance, shard.rank)
        except PoolLayoutError as exc:
            raise ModelLoadFailed(str(exc)) from exc
        from skulk.worker.engines.openmp import physical_cores

        n_threads = spec.n_threads or physical_cores()
        binary = configured_rpc_server()
        if binary is not None:
            self._server = start_rpc_server_process(binary, n_threads, tensor_cache_dir())
            self.rpc_port = self._server.port
        try:
            if self.rpc_port is None:
                self.rpc_port = rpc.start_server(n_threads, tensor_cache_dir())
            self._gate = DonorGate(host, port, channel_key(key, spec.instance, shard.rank), self.rpc_port,
                                   encrypt=encrypt_enabled())
        except (OSError, rpc.RpcUnavailable) as exc:
            self.close()
            raise ModelLoadFailed(f"pool donor could not open its channel on {host}:{port}: {exc}") from exc
        self._gate.start()
        log.info("pool donor rank %d: gate %s:%d -> ggml RPC 127.0.0.1:%d (%s)", shard.rank, host, port, self.rpc_port,
                 binary or "in-process, CPU")

    def warm_up(self) -> None:
        return None

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        raise EngineError("a pool donor serves no requests; its pool's driver (rank 0) does")

    def embed(self, inputs: Any, dimensions: int | None = None) -> Any:
        raise EngineError("a pool donor serves no requests; its pool's driver (rank 0) does")

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()
        if self._server is not None:
            self._server.stop()


__all__ = ["DONOR_CONNECT_DEADLINE_S", "ENCRYPT_ENV", "TENSOR_CACHE_ENV", "PoolDonorEngine", "PoolDriver", "PoolMemberLost"]
