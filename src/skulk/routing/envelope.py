"""Sealed envelopes: authenticated encryption, sender identity and replay rejection for every payload.

Layout of one envelope (all integers big-endian):

    [format: 1 byte = 0xE1] [header length: u16] [header: msgpack {sender, session, seq}]
    [nonce: 12 random bytes] [ChaCha20-Poly1305 ciphertext of the payload, 16-byte tag]

The associated data is everything before the nonce (format, length, header) followed by the
topic key expression, so a valid envelope cannot be re-labelled (other sender, session or
seq) nor moved to another topic or another node's key. The key is derived from the cluster
key and NETWORK_VERSION, so a wrong key and a foreign build both fail as "auth".

The cluster key authenticates membership, not individual nodes: any holder of the key can
claim any sender id. Replay state lives in memory, so it protects one receiver's lifetime.

This module is pure: no zenoh, no sockets, no clock, no logging.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, Literal

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

# High nibble 0xE marks a skulk envelope, low nibble is the envelope format (1).
ENVELOPE_FORMAT: Final = 0xE1
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
_HEADER_LEN: Final = struct.Struct(">H")
# Bound on the unauthenticated header we are willing to parse: sender and session ids are at
# most 128 characters each, so a real header is under 300 bytes.
MAX_HEADER_BYTES: Final = 1024
MAX_FIELD_CHARS: Final = 128
MAX_SEQ: Final = 2**63 - 1
# Replay state: distinct (sender, session) pairs remembered per Opener. A cluster has tens of
# nodes; each restart adds one session, so 1024 covers years of restarts.
DEFAULT_MAX_SENDERS: Final = 1024
MIN_ENVELOPE_BYTES: Final = 1 + _HEADER_LEN.size + 1 + NONCE_BYTES + TAG_BYTES
MAX_ENVELOPE_OVERHEAD_BYTES: Final = 1 + _HEADER_LEN.size + MAX_HEADER_BYTES + NONCE_BYTES + TAG_BYTES
"""The most sealing adds to a payload: a sample longer than a topic's payload bound plus
this cannot be a valid envelope of that topic, so it is refused unread."""

RejectReason = Literal["malformed", "auth", "replay"]


class EnvelopeRejected(Exception):
    """An envelope that must not be delivered.

    reason: "malformed" (not an envelope: garbage, truncated, bad header), "auth" (wrong key,
    other network version, tampered, or moved to another topic), "replay" (seq not greater
    than the last accepted from the same sender session). `claimed_sender` is the sender id
    the header names when it could be parsed; for "malformed" and "auth" it is unverified.
    """

    def __init__(self, reason: RejectReason, detail: str = "", *, claimed_sender: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: RejectReason = reason
        self.detail = detail
        self.claimed_sender = claimed_sender


@dataclass(frozen=True, slots=True)
class Opened:
    """An authenticated, fresh envelope's contents."""

    sender: str
    session: str
    seq: int
    payload: bytes


def _check_key(wire_key: bytes) -> bytes:
    if not isinstance(wire_key, (bytes, bytearray)) or len(wire_key) != 32:
        raise ValueError("wire_key must be 32 bytes (see cluster_key.derive_wire_key)")
    return bytes(wire_key)


def _check_field(name: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS:
        raise ValueError(f"{name} must be a non-empty string of at most {MAX_FIELD_CHARS} characters")
    return value


class Sealer:
    """Seals payloads for one sender session. Thread-safe; seq is monotonic per Sealer.

    Callers that need per-topic ordering (the Router) must seal and hand the envelope to the
    transport in the same order on one thread, or the receiver sees a seq go backwards.
    """

    def __init__(self, wire_key: bytes, sender_node_id: str, session_id: str) -> None:
        self._aead = ChaCha20Poly1305(_check_key(wire_key))
        self._sender = _check_field("sender_node_id", sender_node_id)
        self._session = _check_field("session_id", session_id)
        self._seq = 0
        self._lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        return self._seq

    def seal(self, topic_key: str, payload: bytes) -> bytes:
        with self._lock:
            self._seq += 1
            seq = self._seq
        header = msgpack.packb({"sender": self._sender, "session": self._session, "seq": seq}, use_bin_type=True)
        prefix = bytes([ENVELOPE_FORMAT]) + _HEADER_LEN.pack(len(header)) + header
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = self._aead.encrypt(nonce, bytes(payload), prefix + topic_key.encode("utf-8"))
        return prefix + nonce + ciphertext


def _parse_header(raw: bytes) -> tuple[str, str, int]:
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=0,
            max_array_len=0,
            max_map_len=8,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise EnvelopeRejected("malformed", f"header is not msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"sender", "session", "seq"}:
        raise EnvelopeRejected("malformed", "header must be a map of exactly sender, session, seq")
    sender, session, seq = header["sender"], header["session"], header["seq"]
    claimed = sender if isinstance(sender, str) and 0 < len(sender) <= MAX_FIELD_CHARS else None
    if claimed is None:
        raise EnvelopeRejected("malformed", "header sender is not a short string")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_FIELD_CHARS:
        raise EnvelopeRejected("malformed", "header session is not a short string", claimed_sender=claimed)
    if type(seq) is not int or not 0 < seq <= MAX_SEQ:
        raise EnvelopeRejected("malformed", "header seq is not a positive integer", claimed_sender=claimed)
    return sender, session, seq


class Opener:
    """Authenticates, decrypts and replay-checks envelopes. Thread-safe.

    Replay state is a bounded LRU of the last accepted seq per (sender, session); the least
    recently heard pair is forgotten first. A restarted sender has a new session id and is
    accepted from seq 1. Use one Opener per receive stream whose envelopes arrive in send
    order (the Router uses one per subscription).
    """

    def __init__(self, wire_key: bytes, *, max_senders: int = DEFAULT_MAX_SENDERS) -> None:
        if max_senders < 1:
            raise ValueError("max_senders must be at least 1")
        self._aead = ChaCha20Poly1305(_check_key(wire_key))
        self._max_senders = max_senders
        self._last_seq: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def tracked_senders(self) -> int:
        return len(self._last_seq)

    def open(self, topic_key: str, envelope: bytes) -> Opened:
        data = bytes(envelope)
        if len(data) < MIN_ENVELOPE_BYTES:
            raise EnvelopeRejected("malformed", f"{len(data)} bytes is shorter than any envelope")
        if data[0] != ENVELOPE_FORMAT:
            raise EnvelopeRejected("malformed", f"unknown envelope format 0x{data[0]:02x}")
        (header_len,) = _HEADER_LEN.unpack_from(data, 1)
        header_end = 1 + _HEADER_LEN.size + header_len
        if header_len == 0 or header_len > MAX_HEADER_BYTES or len(data) < header_end + NONCE_BYTES + TAG_BYTES:
            raise EnvelopeRejected("malformed", f"header length {header_len} does not fit the envelope")
        sender, session, seq = _parse_header(data[1 + _HEADER_LEN.size : header_end])
        nonce = data[header_end : header_end + NONCE_BYTES]
        associated = data[:header_end] + topic_key.encode("utf-8")
        try:
            payload = self._aead.decrypt(nonce, data[header_end + NONCE_BYTES :], associated)
        except InvalidTag:
            raise EnvelopeRejected(
                "auth", "authentication failed (wrong cluster key, other network version, tampered or moved)",
                claimed_sender=sender,
            ) from None
        self._accept_seq(sender, session, seq)
        return Opened(sender=sender, session=session, seq=seq, payload=payload)

    def _accept_seq(self, sender: str, session: str, seq: int) -> None:
        pair = (sender, session)
        with self._lock:
            last = self._last_seq.get(pair)
            if last is not None and seq <= last:
                raise EnvelopeRejected("replay", f"seq {seq} <= last accepted {last}", claimed_sender=sender)
            self._last_seq[pair] = seq
            self._last_seq.move_to_end(pair)
            while len(self._last_seq) > self._max_senders:
                self._last_seq.popitem(last=False)
