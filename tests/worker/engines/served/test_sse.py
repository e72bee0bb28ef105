"""The lean loopback transport against a real HTTP/1.1 server (the stdlib's, chunked and
keep-alive like llama-server): lines across chunk boundaries, reuse after a full read, a
dropped socket after an abandoned one, a retry when the server closed an idle connection."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from skulk.worker.engines.served.sse import TRANSPORT_ERRORS, LoopbackStreams


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: ClassVar[list[int]] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        self.connections.append(self.client_address[1])
        if self.path == "/bad":
            payload = b'{"error": "no"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if self.path == "/close":
            self.close_connection = True
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Lines split across chunks on purpose: 'data: a', then 'b\n' + 'data: c\n', then the echo.
        for piece in (b"data: a", b"b\ndata: c\n", b"echo: " + body + b"\n"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server():
    _Handler.connections = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_lines_across_chunks_and_reuse_after_a_full_read(server):
    streams = LoopbackStreams("127.0.0.1", server.server_address[1], 5.0, 5.0)
    try:
        for _ in range(2):
            with streams.post("/completion", b"{}") as response:
                assert response.status == 200
                assert list(response.lines()) == [b"data: ab", b"data: c", b"echo: {}"]
        assert len(set(_Handler.connections)) == 1  # one socket carried both
    finally:
        streams.close()


def test_an_abandoned_stream_drops_its_socket(server):
    streams = LoopbackStreams("127.0.0.1", server.server_address[1], 5.0, 5.0)
    try:
        with streams.post("/completion", b"{}") as response:
            next(response.lines())  # the caller leaves mid-stream (a cancel)
        with streams.post("/completion", b"{}") as response:
            assert list(response.lines())[-1] == b"echo: {}"
        assert len(set(_Handler.connections)) == 2
    finally:
        streams.close()


def test_an_error_status_is_read_whole_and_a_server_closed_connection_is_retried(server):
    streams = LoopbackStreams("127.0.0.1", server.server_address[1], 5.0, 5.0)
    try:
        with streams.post("/bad", b"{}") as response:
            assert (response.status, response.read()) == (400, b'{"error": "no"}')
        with streams.post("/close", b"{}") as response:  # the server closes after this one
            assert list(response.lines())[-1] == b"echo: {}"
        with streams.post("/completion", b"{}") as response:  # stale socket: retried on a new one
            assert list(response.lines())[-1] == b"echo: {}"
    finally:
        streams.close()


def test_nothing_listening_is_a_transport_error_and_a_closed_transport_refuses():
    streams = LoopbackStreams("127.0.0.1", 1, 1.0, 1.0)
    with pytest.raises(TRANSPORT_ERRORS):
        with streams.post("/completion", b"{}"):
            pass
    streams.close()
    with pytest.raises(TRANSPORT_ERRORS):
        with streams.post("/completion", b"{}"):
            pass


def test_idle_connections_are_bounded(server):
    streams = LoopbackStreams("127.0.0.1", server.server_address[1], 5.0, 5.0, max_idle=1)
    try:
        with streams.post("/completion", b"{}") as first, streams.post("/completion", b"{}") as second:
            assert list(first.lines())[-1] == list(second.lines())[-1] == b"echo: {}"
        for _ in range(3):  # one kept, one closed: every later request rides the kept one
            with streams.post("/completion", b"{}") as response:
                list(response.lines())
        assert len(set(_Handler.connections)) == 2
    finally:
        streams.close()
