"""Wires one Skulk node: lease, event log, API (and, as they land, router, election,
master and worker). Holds no policy: every decision lives in a pure module.

Lifecycle: acquire the data-dir lease (or exit naming its holder), open the event log, bind
the API socket, serve until SIGINT/SIGTERM, a self-fence, or a subsystem failure, then shut
down in a bounded time: stop serving, close the log (its live file is archived), release
the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from skulk import __version__
from skulk.api.app import ApiContext, create_app
from skulk.shared.wire_keys import to_camel_keys
from skulk.shared.types.ids import new_id
from skulk.shared.types.state import State
from skulk.store.event_log import DiskEventLog
from skulk.store.lease import Lease, LeaseHeldError
from skulk.store.paths import SkulkPaths, ensure_dirs

logger = logging.getLogger(__name__)

SHUTDOWN_DEADLINE_S = 8.0
"""Everything after a stop request must finish within this, inside the contract's 10 s."""

API_GRACEFUL_SHUTDOWN_S = 3.0
"""Open HTTP streams get this long to finish before uvicorn closes them."""


class ExitCode:
    OK = 0
    FAILURE = 1
    USAGE = 2
    LEASE_HELD = 3
    FENCED = 4


@dataclass(frozen=True)
class NodeSettings:
    paths: SkulkPaths
    node_name: str
    api_host: str = "0.0.0.0"
    api_port: int = 52415
    listen: tuple[str, ...] = ()
    bootstrap_peers: tuple[str, ...] = ()
    multicast: bool = True
    cluster_key: str | None = field(default=None, repr=False)
    api_enabled: bool = True
    worker_enabled: bool = True

    @property
    def api_endpoint(self) -> str | None:
        if not self.api_enabled:
            return None
        host = "127.0.0.1" if self.api_host in ("0.0.0.0", "::") else self.api_host
        return f"http://{host}:{self.api_port}"


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the node owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def bind_api_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = new_id()
        self.state = State()
        self._stop = asyncio.Event()
        self._exit_code = ExitCode.OK

    def request_stop(self, exit_code: int = ExitCode.OK, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            logger.info("node %s stopping: %s", self.node_id, reason)
            self._exit_code = exit_code
            self._stop.set()

    def _fenced(self, reason: str) -> None:
        self.request_stop(ExitCode.FENCED, reason)

    async def run(self) -> int:
        settings = self.settings
        ensure_dirs(settings.paths)
        lease = Lease(settings.paths.lease_file, node_id=self.node_id, api_endpoint=settings.api_endpoint)
        try:
            lease.acquire()
        except LeaseHeldError as exc:
            logger.error("%s; stop it first or give this node its own --data-dir", exc)
            return ExitCode.LEASE_HELD
        try:
            return await self._run_holding_lease(lease)
        finally:
            lease.release()

    async def _run_holding_lease(self, lease: Lease) -> int:
        settings = self.settings
        event_log = DiskEventLog(settings.paths.event_log_dir)
        api_socket = None
        if settings.api_enabled:
            try:
                api_socket = bind_api_socket(settings.api_host, settings.api_port)
            except OSError as exc:
                logger.error("cannot listen on %s:%s: %s", settings.api_host, settings.api_port, exc)
                event_log.close()
                return ExitCode.FAILURE

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop, ExitCode.OK, f"received {signal.Signals(sig).name}")

        tasks: list[asyncio.Task] = [asyncio.create_task(lease.run_renewal(self._fenced), name="lease-renewal")]
        server: _Server | None = None
        if api_socket is not None:
            server = self._make_api_server(lambda: self._diagnostics(event_log, lease))
            tasks.append(asyncio.create_task(server.serve(sockets=[api_socket]), name="api"))
        logger.info(
            "skulk %s node %s (%s) up; data %s; api %s",
            __version__, self.node_id, settings.node_name, settings.paths.data_home, settings.api_endpoint or "off",
        )
        stop_waiter = asyncio.create_task(self._stop.wait(), name="stop-waiter")
        done, _ = await asyncio.wait([stop_waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stop_waiter and not task.cancelled() and task.exception() is not None:
                logger.error("subsystem %s failed: %r", task.get_name(), task.exception())
                self.request_stop(ExitCode.FAILURE, f"{task.get_name()} failed")
        self.request_stop(self._exit_code, "a subsystem finished")
        await self._shutdown(server, tasks, stop_waiter)
        event_log.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        logger.info("node %s stopped", self.node_id)
        return self._exit_code

    def _diagnostics(self, event_log: DiskEventLog, lease: Lease) -> dict[str, Any]:
        return {
            "version": __version__,
            "eventLog": to_camel_keys(event_log.stats()),
            "lease": {"path": str(lease.path), "held": lease.held, "fencedReason": lease.fenced_reason},
        }

    def _make_api_server(self, diagnostics: Callable[[], dict[str, Any]]) -> _Server:
        context = ApiContext(
            node_id=self.node_id,
            node_name=self.settings.node_name,
            get_state=lambda: self.state,
            get_diagnostics=diagnostics,
        )
        config = uvicorn.Config(
            create_app(context),
            log_level="warning",
            timeout_graceful_shutdown=API_GRACEFUL_SHUTDOWN_S,
            lifespan="off",
        )
        return _Server(config)

    async def _shutdown(self, server: _Server | None, tasks: list[asyncio.Task], stop_waiter: asyncio.Task) -> None:
        if server is not None:
            server.should_exit = True
        api_tasks = [t for t in tasks if t.get_name() == "api"]
        for task in tasks:
            if task not in api_tasks:
                task.cancel()
        stop_waiter.cancel()
        _, pending = await asyncio.wait([*tasks, stop_waiter], timeout=SHUTDOWN_DEADLINE_S)
        for task in pending:
            logger.warning("subsystem %s did not stop in %.0f s; cancelling", task.get_name(), SHUTDOWN_DEADLINE_S)
            task.cancel()


def run_node(settings: NodeSettings) -> int:
    return asyncio.run(Node(settings).run())


def default_node_name() -> str:
    return socket.gethostname()



