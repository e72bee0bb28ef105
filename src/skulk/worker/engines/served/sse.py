"""Streaming POSTs to the runner's own loopback server over plain keep-alive sockets.

The per-token hot path of a served engine is one server-sent event per token, read by every
dispatcher thread at once. Through httpx each event costs tens of microseconds of Python
(its h11 state machine, byte and text decoders, line decoder, the pool's lock), measured
at 40-60 us per event with 8 concurrent streams; `http.client`'s chunked `read1` and a
bytes split cost about half. On a CPU-bound box that CPU is taken from the server itself,
so it shows directly in the aggregate throughput at high concurrency.

Each thread keeps its own connection (no pool lock; the dispatcher's threads are long-lived),
reused when a stream was read to its end and dropped otherwise, so a cancelled request's
socket closes and the server frees its slot. A reused connection the server closed while
idle is retried once on a fresh one. Every connect and every read has a deadline. Only
for the runner's own loopback server: no TLS, no proxies, no redirects.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
"""What a failed connect, send or read raises (timeouts are OSErrors)."""

READ_SIZE = 65536


class StreamResponse:
    """One response: its status and its body as lines (bytes, without the newline)."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self._response = response
        self.status = response.status
        self.finished = False

    def lines(self) -> Iterator[bytes]:
        pending = b""
        while True:
            chunk = self._response.read1(READ_SIZE)
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            yield from complete
        if pending:
            yield pending
        self.finished = True

    def read(self) -> bytes:
        body = self._response.read()
        self.finished = True
        return body


class LoopbackStreams:
    """Per-thread keep-alive connections to one loopback HTTP/1.1 server."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._host, self._port = host, port
        self._connect_timeout_s, self._read_timeout_s = connect_timeout_s, read_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._closed = False

    @contextmanager
    def post(self, path: str, payload: bytes) -> Iterator[StreamResponse]:
        """POST `payload` (JSON) and yield the response to stream; raises TRANSPORT_ERRORS."""
        response = self._send(path, payload)
        try:
            yield response
        finally:
            if not response.finished:
                # Unread to its end: the socket cannot carry another request. Closing it is
                # also how the server learns a cancelled client left (and frees its slot).
                self._drop()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._open = self._open, set()
        for connection in connections:
            connection.close()

    def _send(self, path: str, payload: bytes) -> StreamResponse:
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        reused = getattr(self._local, "connection", None) is not None
        for attempt in range(2):
            connection = self._connection()
            try:
                connection.request("POST", path, body=payload, headers=headers)
                return StreamResponse(connection.getresponse())
            except TRANSPORT_ERRORS:
                self._drop()
                if not (reused and attempt == 0):
                    raise
                # The server closed the idle keep-alive connection: once more, on a new one.
        raise AssertionError("unreachable")

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            return connection
        with self._lock:
            if self._closed:
                raise ConnectionError("the engine is closed")
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
            self._open.add(connection)
        self._local.connection = connection  # dropped below, or by the caller's retry, on failure
        connection.connect()
        connection.sock.settimeout(self._read_timeout_s)
        return connection

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with self._lock:
                self._open.discard(connection)
            connection.close()


__all__ = ["TRANSPORT_ERRORS", "LoopbackStreams", "StreamResponse"]
