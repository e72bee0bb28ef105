"""Range reads of a hub file from an offset: what the mock hub's 206 answers give, and a
server that ignores Range (answering the whole file from byte 0) refused, not misread."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from skulk.models import hub_meta
from skulk.models.downloads import HubSource
from tests.mockhub import MockHub, serve

REPO = "mock-org/ranges"
BODY = bytes(range(256)) * 16


def test_read_range_reads_from_an_offset():
    hub = MockHub()
    hub.add_repo(REPO, {"model.bin": BODY})
    with serve(hub):
        source = HubSource(hub.url, None)
        assert hub_meta.read_range(REPO, "model.bin", "main", source, 1000, 24) == BODY[1000:1024]
        assert hub_meta.read_range(REPO, "model.bin", "main", source, len(BODY) - 5, 100) == BODY[-5:]
        assert hub_meta.read_prefix(REPO, "model.bin", "main", source, 10) == BODY[:10]


class _IgnoresRange(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_server_that_ignores_range_is_refused_not_misread():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _IgnoresRange)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        source = HubSource(f"http://127.0.0.1:{server.server_address[1]}", None)
        with pytest.raises(hub_meta.HubError, match="whole file"):
            hub_meta.read_range(REPO, "model.bin", "main", source, 1000, 24)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
