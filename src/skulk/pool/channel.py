"""The pool channel: ggml RPC bytes between a driver and a donor, authenticated with the
cluster key and encrypted.

ggml's RPC protocol has no authentication and executes the graphs sent to it, so a donor's
RPC server listens on 127.0.0.1 only and the only way in from another node is its
`DonorGate`. The driver's `DriverLink` listens on 127.0.0.1 too (llama.cpp dials it as an
ordinary RPC endpoint) and carries each connection to the donor's gate.

Handshake (K = `layout.channel_key`, bound to instance, repair hop and rank):

    driver -> gate : cn (32 random bytes) | HMAC(K, "hello" | cn)
    gate           : a wrong tag -> close, having sent nothing
    gate -> driver : sn (32 random bytes) | HMAC(K, "gate" | cn | sn)
    driver -> gate : HMAC(K, "driver" | cn | sn)       (proves freshness: no replay)

A stray TCP client, or a node with another cluster key, gets nothing and is disconnected
within HANDSHAKE_TIMEOUT_S. Then both sides derive one AES-256-GCM key per direction (HKDF
over K, salt cn | sn) and exchange frames: 4-byte big-endian length, then the payload sealed
with a 12-byte counter nonce (never reused: one key per direction per connection). A frame
that fails authentication closes the connection. A frame carries a burst of ggml RPC
messages, not whatever one read returned (`skulk.pool.framing`, `_pump_out`). AES-GCM
rather than ChaCha20-Poly1305 because the machines that pool a model have AES in hardware
(x86-64 AES-NI/VAES, Apple Silicon's ARMv8 crypto extensions) and OpenSSL then seals about
6x faster (measured: 9 us vs 55 us per 128 KiB frame): a token's logits are sealed and
opened once each per token. (A board without AES instructions, e.g. a Raspberry Pi 4, still
gets OpenSSL's constant-time software AES, only slower.) Unencrypted (`encrypt=False`, the SKULK_POOL_ENCRYPT=0 escape
hatch) the frames carry the payload as is.

Liveness: a frame with an empty payload is a heartbeat. Each side sends one every
HEARTBEAT_INTERVAL_S, and a side that receives no frame at all for SILENCE_DEADLINE_S
declares its peer lost. This is what bounds every wait on a donor: ggml's RPC client waits
for its answers without any deadline, and a donor that is alive to the kernel but silent
(its process or node stopped, its traffic dropped) keeps the TCP connection up, keepalive
probes and all. A donor busy with a long graph still heartbeats (the relay threads are not
the compute thread), so a slow answer is never mistaken for a lost donor.

Deadlines: every handshake read has HANDSHAKE_TIMEOUT_S; every cross-node read and send has
SILENCE_DEADLINE_S; the cross-node socket also has TCP keepalive. On the driver a lost donor
calls `on_lost(donor, reason)` *before* the local socket towards llama.cpp is closed: ggml's
RPC client aborts its process on a closed socket, so the driver must say which node was lost
first (see `llama_pool`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.pool.framing import BETWEEN, REQUESTS, RESPONSES, Framing, advance, lingers

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
DIAL_TIMEOUT_S = 5.0
KEEPALIVE_IDLE_S = 2
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_COUNT = 3
MAX_CONNECTIONS = 8
"""Concurrent channel connections per gate or link (ggml keeps one socket per endpoint);
more are closed at once: nothing queues without bound."""
CHUNK_BYTES = 128 * 1024
"""Plaintext bytes per frame at most; a frame claiming more is refused. Small enough that a
large answer (a token's logits) is sealed, sent, opened and forwarded frame by frame in
overlap, instead of waiting whole at each hop."""
BURST_WAIT_S = 0.002
"""How long a relay waits for more of a burst before sealing what it has (`_pump_out`): the
rest of a ggml RPC message, or the next message after a data-only command. Its sender writes
those microseconds apart, so this bounds only a pause of the driver's (it then computes its
own layers: the data waits for a graph anyway), a misread, or a stalled sender."""
HEARTBEAT_INTERVAL_S = 1.0
"""How often each side of a connection proves it is alive with an empty frame."""
SILENCE_DEADLINE_S = 8.0
"""No frame (data or heartbeat) from the peer for this long: the peer is lost. Eight missed
heartbeats: a loaded machine's scheduling hiccups stay far below it, and the issue's bound
(a typed error naming the node within 5 s of detection) is counted from here."""
NONCE_BYTES = 32
TAG_BYTES = 32
AEAD_OVERHEAD = 16


class ChannelRefused(Exception):
    """The peer failed the handshake (wrong key, stray client, replay) or went silent."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return bytes(data)


def _session_keys(key: bytes, cn: bytes, sn: bytes) -> tuple[bytes, bytes]:
    material = HKDF(algorithm=hashes.SHA256(), length=64, salt=cn + sn, info=b"skulk pool frames|v2").derive(key)
    return material[:32], material[32:]  # (driver -> gate, gate -> driver)


def _no_delay(sock: socket.socket) -> None:
    """ggml RPC is request/response with small messages: Nagle plus delayed ACKs would add
    tens of milliseconds to every one (measured: 13 tok/s instead of hundreds on the tiny
    model), so every socket of the channel sends at once."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Sealer:
    """AES-256-GCM with a counter nonce, sealing/opening into caller-owned buffers
    (`*_into`, no allocation per frame) where the installed `cryptography` offers it."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0
        self._in_place = hasattr(self._aead, "encrypt_into") and hasattr(self._aead, "decrypt_into")

    def _nonce(self) -> bytes:
        nonce = b"\0\0\0\0" + struct.pack(">Q", self._counter)
        self._counter += 1
        return nonce

    def seal(self, data: bytes | memoryview) -> bytes:
        return self._aead.encrypt(self._nonce(), data, None)

    def open(self, data: bytes | memoryview) -> bytes:
        return self._aead.decrypt(self._nonce(), data, None)

    def seal_into(self, data: memoryview, out: memoryview) -> int:
        """Seal `data` into `out`; the sealed length (len(data) + AEAD_OVERHEAD)."""
        size = len(data) + AEAD_OVERHEAD
        if self._in_place:
            self._aead.encrypt_into(self._nonce(), data, None, out[:size])  # type: ignore[attr-defined]
        else:
            out[:size] = self.seal(data)
        return size

    def open_into(self, data: memoryview, out: memoryview) -> int:
        """Open `data` into `out` (InvalidTag when forged); the plain length."""
        size = len(data) - AEAD_OVERHEAD
        if self._in_place:
            self._aead.decrypt_into(self._nonce(), data, None, out[:size])  # type: ignore[attr-defined]
        else:
            out[:size] = self.open(data)
        return size


def client_handshake(sock: socket.socket, key: bytes) -> tuple[bytes, bytes]:
    """The driver's side; returns (send key, receive key) or raises ChannelRefused."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        cn = os.urandom(NONCE_BYTES)
        sock.sendall(cn + _mac(key, b"hello", cn))
        reply = _recv_exact(sock, NONCE_BYTES + TAG_BYTES)
        sn, tag = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(tag, _mac(key, b"gate", cn, sn)):
            raise ChannelRefused("the donor's gate did not prove the cluster key")
        sock.sendall(_mac(key, b"driver", cn, sn))
    except (OSError, ConnectionError) as exc:
        raise ChannelRefused(f"handshake failed: {exc}") from exc
    sock.settimeout(None)
    send, receive = _session_keys(key, cn, sn)
    return send, receive


def server_handshake(sock: socket.socket, key: bytes) -> tuple[bytes, bytes]:
    """The gate's side; returns (send key, receive key) or raises ChannelRefused having
    sent nothing to a client that cannot prove the key."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        hello = _recv_exact(sock, NONCE_BYTES + TAG_BYTES)
        cn, tag = hello[:NONCE_BYTES], hello[NONCE_BYTES:]
        if not hmac.compare_digest(tag, _mac(key, b"hello", cn)):
            raise ChannelRefused("the client did not prove the cluster key")
        sn = os.urandom(NONCE_BYTES)
        sock.sendall(sn + _mac(key, b"gate", cn, sn))
        proof = _recv_exact(sock, TAG_BYTES)
        if not hmac.compare_digest(proof, _mac(key, b"driver", cn, sn)):
            raise ChannelRefused("the client's proof is stale or wrong (a replay?)")
    except (OSError, ConnectionError) as exc:
        raise ChannelRefused(f"handshake failed: {exc}") from exc
    sock.settimeout(None)
    from_driver, to_driver = _session_keys(key, cn, sn)
    return to_driver, from_driver


class _FrameWriter:
    """Frames onto the cross-node socket: data from the local side and heartbeats, one
    writer at a time (the sealer's nonce counter and the socket's byte order both need it).
    One frame buffer, reused: a token's logits (up to megabytes on large vocabularies) cross
    without an allocation per frame."""

    def __init__(self, sock: socket.socket, key: bytes, encrypt: bool) -> None:
        self._sock = sock
        self._sealer = _Sealer(key) if encrypt else None
        self._lock = threading.Lock()
        self._frame = memoryview(bytearray(4 + CHUNK_BYTES + AEAD_OVERHEAD))

    def send(self, payload: memoryview) -> None:
        with self._lock:
            self._send(payload)

    def _send(self, payload: memoryview) -> None:
        if self._sealer is not None:
            size = self._sealer.seal_into(payload, self._frame[4:])
        else:
            size = len(payload)
            self._frame[4 : 4 + size] = payload
        struct.pack_into(">I", self._frame, 0, size)
        self._sock.sendall(self._frame[: 4 + size])

    def heartbeat(self) -> bool:
        """One empty frame unless a send is in progress (it proves life already); False
        when the socket failed (the reader reports why)."""
        if not self._lock.acquire(timeout=HEARTBEAT_INTERVAL_S):
            return True
        try:
            self._send(memoryview(b""))
            return True
        except OSError:
            return False
        finally:
            self._lock.release()


def _pump_out(src: socket.socket, writer: _FrameWriter, framing: Framing, on_end: Callable[[], None]) -> None:
    """Plain bytes from the local `src` to frames on the cross-node socket until `src` ends;
    `on_end()` runs as soon as it has ended, before the bytes read ahead of its end are sent
    (a teardown: failing to deliver those is not the peer's loss).

    One frame per burst, not per `recv` (`skulk.pool.framing`): after a read, the rest of a
    message still arriving, or the message that follows a data-only command, is waited for
    (at most BURST_WAIT_S at a time); bytes already queued are taken without waiting. The
    frame is sealed when the stream stands after a computing or answered command (or an
    answer) with nothing more queued, when a wait runs out, or when the frame is full."""
    buffer = memoryview(bytearray(CHUNK_BYTES))
    poller = select.poll()
    poller.register(src, select.POLLIN)
    wait_ms = max(1, round(BURST_WAIT_S * 1000))
    cursor = BETWEEN
    while True:
        n = src.recv_into(buffer)
        if not n:
            on_end()
            return
        cursor = advance(framing, cursor, buffer[:n])
        filled = n
        ended = False
        while filled < CHUNK_BYTES:
            if cursor.between_messages and not lingers(cursor):
                try:
                    n = src.recv_into(buffer[filled:], 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break  # nothing queued: the burst is whole
            elif poller.poll(wait_ms):
                n = src.recv_into(buffer[filled:])
            else:
                break  # the sender paused (or a message was misread): send what we have
            if not n:
                ended = True
                break
            cursor = advance(framing, cursor, buffer[filled : filled + n])
            filled += n
        if ended:
            on_end()
        writer.send(buffer[:filled])
        if ended:
            return


def _recv_into(sock: socket.socket, view: memoryview) -> bool:
    """Fill `view` from `sock`; False when the peer ended before the first byte (a clean
    end between frames); ConnectionError when it ended inside."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            if got == 0:
                return False
            raise ConnectionError("peer closed inside a frame")
        got += n
    return True


def _pump_in(src: socket.socket, dst: socket.socket, key: bytes, encrypt: bool) -> None:
    """Frames from the cross-node `src` to plain bytes on the local `dst` until `src` ends
    (between frames); heartbeats are dropped; a forged or oversized frame raises, and so does
    SILENCE_DEADLINE_S without any frame (TimeoutError from the socket). A sealed frame is
    forwarded once whole and authenticated; a plain frame's bytes are forwarded as they come."""
    opener = _Sealer(key) if encrypt else None
    overhead = AEAD_OVERHEAD if encrypt else 0
    header = memoryview(bytearray(4))
    body = memoryview(bytearray(CHUNK_BYTES + overhead))
    plain = memoryview(bytearray(CHUNK_BYTES))
    while True:
        try:
            if not _recv_into(src, header):
                return
        except ConnectionError:
            return
        (length,) = struct.unpack(">I", header)
        if not overhead <= length <= CHUNK_BYTES + overhead:
            raise ChannelRefused(f"frame of {length} bytes refused")
        if opener is None:
            left = length
            while left:
                n = src.recv_into(body[:left])
                if not n:
                    raise ConnectionError("peer closed inside a frame")
                dst.sendall(body[:n])
                left -= n
            continue
        if length and not _recv_into(src, body[:length]):
            raise ConnectionError("peer closed inside a frame")
        try:
            size = opener.open_into(body[:length], plain)
        except InvalidTag:
            raise ChannelRefused("a frame failed authentication") from None
        if size:
            dst.sendall(plain[:size])


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


@dataclass(frozen=True)
class Remote:
    """One end a DriverLink dials: the donor's gate and what to call it in errors."""

    host: str
    port: int
    name: str


class _Listener:
    """A listening socket with a bounded set of connection threads; `close` ends all."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self._sock = socket.create_server((host, port), backlog=MAX_CONNECTIONS, reuse_port=False)
        self.port = self._sock.getsockname()[1]
        self._name = name
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            _no_delay(conn)
            self._track(conn)
            threading.Thread(target=self._serve_slot, args=(conn,), name=f"{self._name}-conn", daemon=True).start()

    def _serve_slot(self, conn: socket.socket) -> None:
        try:
            self.serve(conn)
        except Exception:  # one connection's failure never ends the listener
            log.exception("%s: connection failed", self._name)
        finally:
            self._untrack(conn)
            _close(conn)
            self._slots.release()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    def close(self) -> None:
        self._closed.set()
        _close(self._sock)
        with self._lock:
            socks = list(self._open)
        _close(*socks)


class DonorGate(_Listener):
    """A donor's door: authenticates each connection with the channel key, then relays it
    to the local ggml RPC server at 127.0.0.1:`rpc_port`."""

    def __init__(self, host: str, port: int, key: bytes, rpc_port: int, *, encrypt: bool = True) -> None:
        super().__init__(host, port, "pool-gate")
        self._key = key
        self._rpc_port = rpc_port
        self._encrypt = encrypt
        self.refused = 0
        """Connections that failed the handshake (for tests and diagnostics)."""

    def serve(self, conn: socket.socket) -> None:
        try:
            send_key, receive_key = server_handshake(conn, self._key)
        except ChannelRefused as refusal:
            self.refused += 1
            log.warning("pool gate: refused a connection: %s", refusal)
            return
        _keepalive(conn)
        local = socket.create_connection(("127.0.0.1", self._rpc_port), timeout=DIAL_TIMEOUT_S)
        local.settimeout(None)
        _no_delay(local)
        self._track(local)
        try:
            _relay(conn, local, send_key, receive_key, self._encrypt, RESPONSES)
        finally:
            self._untrack(local)
            _close(local)


def _relay(remote: socket.socket, local: socket.socket, send_key: bytes, receive_key: bytes, encrypt: bool,
           local_framing: Framing, on_remote_end: Callable[[str], None] | None = None) -> None:
    """Relay both directions until either side ends, heartbeating the remote side.
    `local_framing`: the messages the local side writes (requests on a driver's link,
    responses on a donor's gate). Every
    wait on the remote side has SILENCE_DEADLINE_S. `on_remote_end(reason)` runs (once)
    when the remote side ended, failed or went silent, before the local socket is closed:
    whichever direction notices first, a read that sees the peer's end or its silence, or a
    send to the peer that fails (a dead donor is often first seen by the driver's next
    send). Only a local end (llama.cpp closed its socket: a normal teardown) calls nothing."""
    remote.settimeout(SILENCE_DEADLINE_S)
    writer = _FrameWriter(remote, send_key, encrypt)
    local_closed = threading.Event()
    outbound_done = threading.Event()
    told = threading.Lock()
    reported: list[str] = []

    def remote_ended(why: str) -> None:
        with told:
            if reported or local_closed.is_set():
                return
            reported.append(why)
        if on_remote_end is not None:
            on_remote_end(why)  # before llama.cpp sees a closed socket

    def outbound() -> None:  # local plain -> remote
        try:
            _pump_out(local, writer, local_framing, local_closed.set)
        except Exception as exc:  # the send to the peer failed (or timed out)
            remote_ended(f"sending to the peer failed: {type(exc).__name__}: {exc}")
        finally:
            outbound_done.set()
            try:
                remote.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def heartbeats() -> None:
        while not outbound_done.wait(HEARTBEAT_INTERVAL_S):
            if not writer.heartbeat():
                return

    thread = threading.Thread(target=outbound, name="pool-relay-out", daemon=True)
    thread.start()
    beat = threading.Thread(target=heartbeats, name="pool-relay-heartbeat", daemon=True)
    beat.start()
    try:
        _pump_in(remote, local, receive_key, encrypt)
        why = "the peer closed the channel"
    except TimeoutError:
        why = f"no frame from the peer in {SILENCE_DEADLINE_S:g} s (its process or node stopped, or its traffic is dropped)"
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    remote_ended(why)
    outbound_done.set()
    _close(local, remote)
    thread.join(timeout=DIAL_TIMEOUT_S)
    beat.join(timeout=DIAL_TIMEOUT_S)


class DriverLink(_Listener):
    """The driver's local end for one donor: 127.0.0.1:`port` (an ordinary ggml RPC
    endpoint for llama.cpp); each connection is carried to the donor's gate."""

    def __init__(self, remote: Remote, key: bytes, on_lost: Callable[[Remote, str], None], *,
                 encrypt: bool = True) -> None:
        super().__init__("127.0.0.1", 0, "pool-link")
        self.remote = remote
        self._key = key
        self._on_lost = on_lost
        self._encrypt = encrypt

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _remote_ended(self, why: str) -> None:
        if not self._closed.is_set():  # closed by its owner (a teardown): not the donor's loss
            self._on_lost(self.remote, why)

    def probe(self) -> None:
        """One authenticated connection to the gate, closed at once: raises ChannelRefused
        (or OSError) when the donor is not reachable or does not hold the key."""
        sock = socket.create_connection((self.remote.host, self.remote.port), timeout=DIAL_TIMEOUT_S)
        try:
            client_handshake(sock, self._key)
        finally:
            _close(sock)

    def serve(self, conn: socket.socket) -> None:
        try:
            remote = socket.create_connection((self.remote.host, self.remote.port), timeout=DIAL_TIMEOUT_S)
            _no_delay(remote)
        except OSError as exc:
            self._on_lost(self.remote, f"cannot reach its pool channel: {exc}")
            return
        self._track(remote)
        try:
            try:
                send_key, receive_key = client_handshake(remote, self._key)
            except ChannelRefused as refusal:
                self._on_lost(self.remote, str(refusal))
                return
            _keepalive(remote)
            _relay(remote, conn, send_key, receive_key, self._encrypt, REQUESTS,
                   on_remote_end=self._remote_ended)
        finally:
            self._untrack(remote)
            _close(remote)


__all__ = [
    "BURST_WAIT_S",
    "CHUNK_BYTES",
    "DIAL_TIMEOUT_S",
    "HANDSHAKE_TIMEOUT_S",
    "HEARTBEAT_INTERVAL_S",
    "MAX_CONNECTIONS",
    "SILENCE_DEADLINE_S",
    "ChannelRefused",
    "DonorGate",
    "DriverLink",
    "Remote",
    "client_handshake",
    "server_handshake",
]
