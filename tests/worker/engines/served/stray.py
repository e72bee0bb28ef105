"""A real stray HTTP server for port-race tests: another process's server on the port a
served engine was about to bind, answering /health (and everything else) with 200."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _StrayHealth(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def serve_stray(*, reuse_port: bool = False) -> Iterator[int]:
    """Serve on a free loopback port (with SO_REUSEPORT when `reuse_port`, so a second
    listener of the same user can share the port); yields the port, stops at the end."""
    server_class = type("_SharingServer", (_Server,), {"allow_reuse_port": True}) if reuse_port else _Server
    server = server_class(("127.0.0.1", 0), _StrayHealth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
