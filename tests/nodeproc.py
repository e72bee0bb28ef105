"""Start real `skulk` node processes for tests: free ports, own data dirs, always cleaned up.

A port from `free_port()` is free when probed, not when the node binds it: another process
(another engineer's test on a shared box) may take it in between. A node that exits because
its port was taken says so in its log; `wait_ready` then restarts it on a new API port, and
`tests.cluster.harness.start_linked` restarts its nodes on new transport ports (bounded by
PORT_TRIES, as the llama-server engine and the router test kit retry their own binds)."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_DEADLINE_S = 60.0
PORT_TRIES = 3
"""Starts of one node (or one linked set) on fresh ports before a taken port fails the test."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], object], *, timeout_s: float, interval_s: float = 0.1, what: str = "condition"):
    """Poll `condition` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}; last error: {last_error!r}")


class PortTaken(AssertionError):
    """The node exited because `port` was taken when it tried to bind it."""

    def __init__(self, port: int, log: str) -> None:
        super().__init__(f"port {port} was taken before the node bound it:\n{log[-4000:]}")
        self.port = port


def taken_port(log: str, ports: Iterable[int]) -> int | None:
    """The port among `ports` that the node's log says it could not bind because another
    process held it (the API's "cannot listen on host:port", the transport's "TCP listener
    bound to tcp/host:port"), or None when the log names no such failure."""
    wanted = list(ports)
    for line in log.splitlines():
        if "address already in use" not in line.lower():
            continue
        for port in wanted:
            if f":{port}:" in line or f":{port} " in line or line.endswith(f":{port}"):
                return port
    return None


def listen_ports(args: Iterable[str]) -> list[int]:
    """The transport ports a node's `--listen <endpoint>` arguments bind."""
    args = list(args)
    return [int(value.rsplit(":", 1)[1]) for flag, value in itertools.pairwise(args)
            if flag == "--listen" and value.rsplit(":", 1)[-1].isdigit()]


@dataclass
class NodeProcess:
    data_dir: Path
    api_port: int
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    netns: str | None = None
    """Run the node inside this network namespace (its API is then reached through it)."""
    multicast: bool = False
    api_host: str = "127.0.0.1"
    port_tries: int = 1
    """Starts `wait_ready` makes on a fresh API port when the node exits because its API port
    was taken (1: the caller chose the port, so it is never changed)."""

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.api_host in ("0.0.0.0", "") else self.api_host
        return f"http://{host}:{self.api_port}"

    def start(self) -> NodeProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        env = {**os.environ, "SKULK_LOG_LEVEL": "INFO", **self.env}
        env.pop("SKULK_HOME", None)
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        args = [
            *prefix, sys.executable, "-m", "skulk", "run",
            "--data-dir", str(self.data_dir),
            "--api-port", str(self.api_port),
            "--api-host", self.api_host,
            *([] if self.multicast else ["--no-multicast"]),
            *self.extra_args,
        ]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    @property
    def api_key(self) -> str | None:
        """The key this node requires from non-loopback clients: the env's, else the one the
        node created in its data dir on first start (what `skulk api-key` prints)."""
        if self.env.get("SKULK_API_KEY"):
            return self.env["SKULK_API_KEY"]
        key_file = self.data_dir / "api.key"
        return key_file.read_text().strip() if key_file.is_file() else None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if (key := self.api_key) else {}

    def get(self, path: str, **kwargs) -> httpx.Response:
        if self.netns is None:
            headers = {**self.auth, **kwargs.pop("headers", {})}
            return httpx.get(self.url + path, timeout=5, headers=headers, **kwargs)
        auth = [arg for name, value in self.auth.items() for arg in ("-H", f"{name}: {value}")]
        result = subprocess.run(
            ["ip", "netns", "exec", self.netns, "curl", "-s", "-m", "5", *auth, "-w", "\n%{http_code}",
             self.url + path],
            capture_output=True, text=True, timeout=15,
        )
        body, _, status = result.stdout.rpartition("\n")
        return httpx.Response(int(status or 0), content=body.encode())

    def wait_ready(self, timeout_s: float = START_DEADLINE_S) -> NodeProcess:
        """Wait until the node answers; raise `PortTaken` if it exited because a port it was
        given was taken (after restarting it on a fresh API port, `port_tries` times in all,
        when that port was the API's), AssertionError on any other early exit or a hang."""
        for attempt in range(self.port_tries):
            try:
                return self._wait_ready_once(timeout_s)
            except PortTaken as taken:
                if taken.port != self.api_port or attempt + 1 == self.port_tries:
                    raise
                self.stop()
                self.api_port = free_port()
                self.start()
        raise AssertionError("unreachable")

    def _wait_ready_once(self, timeout_s: float) -> NodeProcess:
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while True:
            if self.proc.poll() is not None:
                log = self.log()
                port = taken_port(log, [self.api_port, *listen_ports(self.extra_args)])
                if port is not None:
                    raise PortTaken(port, log)
                raise AssertionError(f"node exited early with {self.proc.returncode}:\n{log}")
            try:
                if self.get("/node_id").status_code == 200:
                    return self
            except Exception as exc:  # not listening yet
                last_error = exc
            if time.monotonic() > deadline:
                raise AssertionError(f"hung: node on :{self.api_port} not ready within {timeout_s:.0f}s; "
                                     f"last error: {last_error!r}\n{self.log()}")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
