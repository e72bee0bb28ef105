"""One inference server process, owned by one runner: start, health deadline, teardown.

The server never outlives its owner:
- it runs in its own process group (so teardown reaches anything it forks), and
- it is started with PR_SET_PDEATHSIG=SIGKILL (Linux): when the runner dies, even by
  kill -9, the kernel kills the server. The signal follows the *thread* that forked, so the
  runner starts the server from its main thread (the engine's `load`), which lives as long
  as the runner does.
`stop` sends SIGTERM to the group, then SIGKILL after a grace. The server's output goes to
a temporary file (bounded by the server's own logging; removed at stop) whose tail explains
a failed start: a port already taken, a model it cannot read, an unknown flag.

The port is found free by binding and releasing it, so another process may take it before
the server binds it. A taken port must never pass for our server: a `/health` 200 counts
only once our child (or a process it forked) is the only listener on the port (psutil
reads the socket table on Linux and macOS; a per-start secret such as an API key would
need each engine's own way of echoing it, and every request to carry it). `start_healthy` starts the server again on a fresh port when the port was
taken, a bounded number of times.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from skulk.shared.types.stream_errors import StreamErrorType
from skulk.worker.engines.base import EngineError, EngineNotLoaded, GeneratedToken, ModelLoadFailed

log = logging.getLogger(__name__)

HEALTH_DEADLINE_S = 300.0
"""How long a server may take to load its model and answer /health with 200: a large GGUF
read from a slow disk, with margin. Past it the start fails and the server is killed."""

HEALTH_POLL_S = 0.1
STOP_GRACE_S = 5.0
"""SIGTERM to SIGKILL: llama-server finishes its current batch and exits well within it."""
LOG_TAIL_BYTES = 4000
"""How much of the server's output a start failure quotes."""

PR_SET_PDEATHSIG = 1
PORT_ATTEMPTS = 3
"""A free port found by binding and releasing it can be taken before the server binds it;
a start that chose the port itself retries with a fresh one this many times in all."""

_PORT_TAKEN_MARKERS = ("couldn't bind", "address already in use", "failed to bind")


class ServerBinaryMissing(ModelLoadFailed):
    error_type = StreamErrorType.ENGINE_BINARY_MISSING


class ServerPortTaken(ModelLoadFailed):
    error_type = StreamErrorType.ENGINE_PORT_TAKEN


class ServerStartFailed(ModelLoadFailed):
    error_type = StreamErrorType.ENGINE_START_FAILED


class ServerGone(EngineError):
    """The server died while serving; the runner cannot serve again."""

    error_type = StreamErrorType.ENGINE_BROKEN


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


LOOPBACK_REACHING = frozenset({"127.0.0.1", "0.0.0.0", "::"})
"""Listening addresses a request to 127.0.0.1 can reach (`::` is a dual-stack wildcard)."""


def _family_of(pid: int) -> set[int] | None:
    """`pid` and its descendants (a server may listen from a process it forked); None when
    `pid` is gone."""
    try:
        root = psutil.Process(pid)
        return {root.pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return None


def owns_port(pid: int, port: int) -> bool | None:
    """Whether process `pid` (or one it forked) is the only listener a request to
    127.0.0.1:`port` can reach. False when it does not listen there, or another process
    does too (llama-server binds with SO_REUSEPORT, so a second server of the same user
    can share its port); None when the socket table cannot be read (macOS without root
    lists only our own processes' sockets: then only whether ours listens is known)."""
    family = _family_of(pid)
    if family is None:
        return False
    try:
        sockets = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return _listens_in(family, port)
    owners = [s.pid for s in sockets
              if s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port and s.laddr.ip in LOOPBACK_REACHING]
    return bool(owners) and all(owner in family for owner in owners)


def _listens_in(family: set[int], port: int) -> bool | None:
    """Whether one of the `family` processes listens on `port` (None: none could be read)."""
    readable = False
    for pid in family:
        try:
            sockets = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        readable = True
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False if readable else None


def _death_signal_preexec() -> Callable[[], None] | None:
    """A preexec_fn that asks the kernel to SIGKILL the child when its parent thread dies.
    Resolved before fork: the child only makes one libc call (no imports, no allocation)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class ServerProcess:
    """A started server: its pid, base URL, and the means to stop it."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        binary = Path(argv[0])
        self.name = binary.name
        if not binary.is_file():
            raise ServerBinaryMissing(f"llama-server binary not found at {binary}; run `skulk engines install`")
        if not os.access(binary, os.X_OK):
            raise ServerBinaryMissing(f"{binary} is not executable (chmod +x, or rebuild with `skulk engines install`)")
        self._log = tempfile.NamedTemporaryFile(prefix="skulk-llama-server-", suffix=".log", delete=False)  # noqa: SIM115 -- lives as long as the server; closed in close()
        try:
            self._process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env=dict(env), start_new_session=True, preexec_fn=_death_signal_preexec(),
            )
        except OSError as exc:
            self._close_log()
            raise ServerStartFailed(f"{binary} could not start: {exc}") from exc

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def wait_healthy(self, deadline_s: float = HEALTH_DEADLINE_S) -> None:
        """Return once our server answers /health with 200; raise (after stopping the
        server) on exit, on timeout, or when the 200 came from another process that holds
        the port (`ServerPortTaken`)."""
        deadline = time.monotonic() + deadline_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if not self.alive():
                    code = self._process.returncode
                    tail = self.log_tail()
                    self.stop()
                    if any(marker in tail.lower() for marker in _PORT_TAKEN_MARKERS):
                        raise ServerPortTaken(f"port {self.port} on 127.0.0.1 is already in use:\n{tail}")
                    raise ServerStartFailed(f"{self.name} exited with code {code} while starting:\n{tail}")
                healthy = False
                with contextlib.suppress(httpx.HTTPError):
                    healthy = client.get(f"{self.base_url}/health").status_code == 200
                if healthy:
                    # The answer is ours only if our process listens on the port: a
                    # stranger that took the port first answers too.
                    if owns_port(self.pid, self.port) is not False:
                        return
                    if self.alive():  # not a server that answered and then exited
                        self.stop()
                        raise ServerPortTaken(f"port {self.port} on 127.0.0.1 is held by another process: "
                                              f"its /health answered, not {self.name}'s")
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    self.stop()
                    raise ServerStartFailed(f"{self.name} did not become healthy within {deadline_s:g}s:\n{tail}")
                time.sleep(HEALTH_POLL_S)

    def log_tail(self) -> str:
        try:
            data = Path(self._log.name).read_bytes()
        except OSError:
            return ""
        return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace").strip()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace_s`. Idempotent."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The group may hold children of the server even after the leader exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(grace_s)
        self._close_log()

    def _close_log(self) -> None:
        with contextlib.suppress(OSError):
            self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


def start_healthy(
    argv_for: Callable[[int], Sequence[str]],
    env: Mapping[str, str],
    *,
    port: int | None = None,
    attempts: int = PORT_ATTEMPTS,
    deadline_s: float = HEALTH_DEADLINE_S,
) -> ServerProcess:
    """Start the server `argv_for(port)` describes on a free loopback port and return it
    once healthy. When the port was taken before the server bound it (the server says so,
    or another process answers on it), start it again on a fresh port, `attempts` starts
    in all; a caller-chosen `port` is tried once, never changed."""
    tries = 1 if port is not None else max(1, attempts)
    for attempt in range(tries):
        chosen = port if port is not None else free_loopback_port()
        server = ServerProcess(argv_for(chosen), env, chosen)
        try:
            server.wait_healthy(deadline_s)
            return server
        except ServerPortTaken:
            if attempt + 1 == tries:
                raise
            log.info("port %d was taken before %s bound it; trying another", chosen, server.name)
    raise AssertionError("unreachable")


__all__ = [
    "HEALTH_DEADLINE_S",
    "PORT_ATTEMPTS",
    "STOP_GRACE_S",
    "ServedEngineShell",
    "ServerBinaryMissing",
    "ServerGone",
    "ServerPortTaken",
    "ServerProcess",
    "ServerStartFailed",
    "free_loopback_port",
    "owns_port",
    "start_healthy",
]


class ServedEngineShell:
    """What every served engine shares: the server process and the HTTP client it owns,
    the count of generations in flight, and closing both (client first, then the process
    group). Subclasses set `_server` and `_client` in `load`."""

    def __init__(self) -> None:
        self._server: ServerProcess | None = None
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _require_loaded(self) -> httpx.Client:
        if self._client is None:
            raise EngineNotLoaded("no model is loaded")
        return self._client

    def _counted(self, tokens: Iterator[GeneratedToken]) -> Iterator[GeneratedToken]:
        """`tokens`, counted in flight while they are being drawn."""
        with self._lock:
            self._in_flight += 1
        try:
            yield from tokens
        finally:
            with self._lock:
                self._in_flight -= 1

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
        server, self._server = self._server, None
        if server is not None:
            server.stop()

