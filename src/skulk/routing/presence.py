"""Presence tokens: which nodes of this cluster are alive, from zenoh liveliness.

A node declares one liveliness token `skulk/<ver>/presence/<node>/<session>/<tag>`. Tokens
carry no payload, so they cannot be sealed; instead `tag` is a truncated HMAC of
(node, session) under a key derived from the wire key. A node with another cluster key or
another network version produces tokens that fail the tag check: they are counted as "auth"
rejects and never reported as members. (A peer that can observe a valid token can re-declare
it; that can keep a dead node looking alive, never admit a new one.)

`PresenceTracker` folds token appearances and disappearances into per-node alive/dead
changes: a node is alive while at least one of its sessions holds a token, so a restart whose
new token appears before the old one expires is not reported as a departure.

This module is pure: no zenoh, no clock, no logging.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from dataclasses import dataclass
from typing import Final, NamedTuple

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.routing.constants import NETWORK_VERSION, is_valid_id, presence_root

# 16 bytes of HMAC-SHA256 (128 bits): far beyond guessing, short enough for a key chunk.
TAG_BYTES: Final = 16
_PRESENCE_KEY_INFO: Final = b"skulk presence tag|"


def presence_key_material(wire_key: bytes) -> bytes:
    """A subkey for presence tags, so the AEAD key is never used for a second purpose."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_PRESENCE_KEY_INFO).derive(wire_key)


def presence_tag(presence_key: bytes, node_id: str, session_id: str) -> str:
    digest = hmac.new(presence_key, f"{node_id}\x00{session_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:TAG_BYTES]).rstrip(b"=").decode("ascii")


def presence_token_key(presence_key: bytes, node_id: str, session_id: str, *, network_version: str = NETWORK_VERSION) -> str:
    tag = presence_tag(presence_key, node_id, session_id)
    return f"{presence_root(network_version)}/{node_id}/{session_id}/{tag}"


@dataclass(frozen=True, slots=True)
class PresenceToken:
    node_id: str
    session_id: str


class PresenceRejected(Exception):
    """A token under the presence root that is not a valid token of this cluster."""

    def __init__(self, reason: str, claimed_node: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.claimed_node = claimed_node


def parse_presence_key(presence_key: bytes, key_expr: str, *, network_version: str = NETWORK_VERSION) -> PresenceToken:
    """The token a key expression names; PresenceRejected("malformed" | "auth") otherwise."""
    root = presence_root(network_version) + "/"
    if not key_expr.startswith(root):
        raise PresenceRejected("malformed", None)
    parts = key_expr[len(root) :].split("/")
    if len(parts) != 3:
        raise PresenceRejected("malformed", parts[0] if parts and is_valid_id(parts[0]) else None)
    node_id, session_id, tag = parts
    if not (is_valid_id(node_id) and is_valid_id(session_id)):
        raise PresenceRejected("malformed", node_id if is_valid_id(node_id) else None)
    if not hmac.compare_digest(tag, presence_tag(presence_key, node_id, session_id)):
        raise PresenceRejected("auth", node_id)
    return PresenceToken(node_id, session_id)


class PresenceChange(NamedTuple):
    node_id: str
    alive: bool


class PresenceTracker:
    """Live sessions per node; turns token events into node-level changes. Thread-safe."""

    def __init__(self) -> None:
        self._sessions: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def appeared(self, token: PresenceToken) -> PresenceChange | None:
        with self._lock:
            sessions = self._sessions.setdefault(token.node_id, set())
            was_alive = bool(sessions)
            sessions.add(token.session_id)
        return None if was_alive else PresenceChange(token.node_id, True)

    def disappeared(self, token: PresenceToken) -> PresenceChange | None:
        with self._lock:
            sessions = self._sessions.get(token.node_id)
            if not sessions or token.session_id not in sessions:
                return None
            sessions.discard(token.session_id)
            if sessions:
                return None
            del self._sessions[token.node_id]
        return PresenceChange(token.node_id, False)

    def alive(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._sessions)
