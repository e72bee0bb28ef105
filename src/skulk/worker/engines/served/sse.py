"""Streaming POSTs to the runner's own loopback server over plain keep-alive sockets.

The per-token hot path of a served engine is one server-sent event per token, read by every
dispatcher thread at once. Through httpx each event costs tens of microseconds of Python
(its h11 state machine, byte and text decoders, line decoder, the pool's lock), measured
at 40-60 us per event with 8 concurrent streams; `http.client`'s chunked `read1` and a
bytes split cost about half. On a CPU-bound box that CPU is taken from the server itself,
so it shows directly in the aggregate throughput at high concurrency.

A request takes an idle connection (one lock operation per request, none per token) or
opens one; a stream read to its end returns its connection to a bounded idle list (at most
the slot count: llama-server holds an HTTP thread per open connection), any other is
closed, so a cancelled request's socket closes and the server frees its slot. A reused
connection the server closed while idle is retried once on a fresh one. Every connect and
every read has a deadline. Only for the runner's own loopback server: no TLS, no proxies,
no redirects.
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
    """Keep-alive connections to one loopback HTTP/1.1 server, taken per request."""

    def __init__(
        self, host: str, port: int, connect_timeout_s: float, read_timeout_s: float, max_idle: int = 8
    ) -> None:
        self._host, self._port = host, port
        self._connect_timeout_s, self._read_timeout_s = connect_timeout_s, read_timeout_s
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        """Connections whose last response was read to its end, newest last (bounded)."""
        self._closed = False

    @contextmanager
    def post(self, path: str, payload: bytes) -> Iterator[StreamResponse]:
        """POST `payload` (JSON) and yield the response to stream; raises TRANSPORT_ERRORS."""
        connection, response = self._send(path, payload)
        try:
            yield response
        finally:
            # Unread to its end, a socket cannot carry another request; closing it is also
            # how the server learns a cancelled client left (and frees its slot).
            if response.finished:
                self._release(connection)
            else:
                connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _send(self, path: str, payload: bytes) -> tuple[http.client.HTTPConnection, StreamResponse]:
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        connection, reused = self._take()
        while True:
            try:
                connection.request("POST", path, body=payload, headers=headers)
                return connection, StreamResponse(connection.getresponse())
            except TRANSPORT_ERRORS:
                connection.close()
                if not reused:
                    raise
                # The server closed the idle keep-alive connection: once more, on a new one.
                connection, reused = self._new(), False

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._closed:
                raise ConnectionError("the engine is closed")
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _new(self) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
        try:
            connection.connect()
            connection.sock.settimeout(self._read_timeout_s)
        except BaseException:
            connection.close()
            raise
        return connection

    def _release(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()


__all__ = ["TRANSPORT_ERRORS", "LoopbackStreams", "StreamResponse"]
