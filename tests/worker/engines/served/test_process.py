"""The served-engine process kit against a real stray HTTP server on its port: a /health
200 from another process never passes for our server's, and a start whose port was taken
runs again on a fresh one. The server here is a small Python HTTP server that, like vLLM,
binds only after loading (llama-server itself: `test_llama_server.py`)."""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from skulk.worker.engines.served import process
from skulk.worker.engines.served.process import ServerPortTaken, ServerProcess, owns_port, start_healthy
from tests.worker.engines.served.stray import serve_stray

pytestmark = pytest.mark.timeout(120)

HANG_GUARD_S = 60.0
"""The health deadline these starts get: a guard against a hang, never reached when they pass."""

SERVER = '''
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

port, load_s, reuse = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
time.sleep(load_s)  # loading the model before binding, as vLLM does


class Ours(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"ours")

    def log_message(self, *args):
        pass


HTTPServer.allow_reuse_port = reuse
try:
    server = HTTPServer(("127.0.0.1", port), Ours)
except OSError as exc:
    print(f"failed to bind 127.0.0.1:{port}: {exc}", flush=True)
    sys.exit(1)
server.serve_forever()
'''


@pytest.fixture
def server_binary(tmp_path) -> Path:
    """An executable that serves 200 on its port argument (argv: port, load seconds, reuse)."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    binary = tmp_path / "fake-vllm"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    binary.chmod(stat.S_IRWXU)
    return binary


@pytest.fixture
def stray_port() -> Iterator[int]:
    yield from serve_stray()


@pytest.fixture
def sharing_stray_port() -> Iterator[int]:
    yield from serve_stray(reuse_port=True)


def _gone(server: ServerProcess) -> bool:
    return (not server.alive() and not psutil.pid_exists(server.pid)) or psutil.Process(server.pid).status() == "zombie"


def test_a_strays_health_answer_while_our_server_loads_is_port_taken(server_binary, stray_port):
    # Ours is still loading (it would bind in an hour): the 200 can only be the stray's.
    server = ServerProcess([str(server_binary), str(stray_port), "3600", "0"], {}, stray_port)
    with pytest.raises(ServerPortTaken, match=f"port {stray_port} .*held by another process"):
        server.wait_healthy(HANG_GUARD_S)
    assert _gone(server)


def test_a_port_shared_with_another_listener_is_port_taken(server_binary, sharing_stray_port):
    # Both bind with SO_REUSEPORT (llama-server's own socket option): the kernel would
    # split our requests between the two servers.
    server = ServerProcess([str(server_binary), str(sharing_stray_port), "0", "1"], {}, sharing_stray_port)
    with pytest.raises(ServerPortTaken, match=str(sharing_stray_port)):
        server.wait_healthy(HANG_GUARD_S)
    assert _gone(server)


def test_a_taken_port_starts_the_server_again_on_a_fresh_one(server_binary, stray_port, monkeypatch):
    handed_out: list[int] = []
    fresh_port = process.free_loopback_port

    def racing_free_port() -> int:
        port = stray_port if not handed_out else fresh_port()  # the first is taken first
        handed_out.append(port)
        return port

    monkeypatch.setattr(process, "free_loopback_port", racing_free_port)
    server = start_healthy(lambda port: [str(server_binary), str(port), "0", "0"], {}, deadline_s=HANG_GUARD_S)
    try:
        assert handed_out[0] == stray_port and server.port == handed_out[-1] != stray_port
        assert owns_port(server.pid, server.port) is True
    finally:
        server.stop()


def test_a_caller_chosen_port_is_tried_once(server_binary, stray_port):
    with pytest.raises(ServerPortTaken):
        start_healthy(lambda port: [str(server_binary), str(port), "0", "0"], {}, port=stray_port,
                      deadline_s=HANG_GUARD_S)


def test_every_start_taken_fails_typed_after_its_attempts(server_binary, stray_port, monkeypatch):
    handed_out: list[int] = []
    monkeypatch.setattr(process, "free_loopback_port", lambda: handed_out.append(stray_port) or stray_port)
    with pytest.raises(ServerPortTaken):
        start_healthy(lambda port: [str(server_binary), str(port), "3600", "0"], {}, deadline_s=HANG_GUARD_S)
    assert len(handed_out) == process.PORT_ATTEMPTS
