"""Counting what the receive path refused, per reason and per peer, and saying so once.

Reasons:
- "malformed": not an envelope (garbage, truncated, bad header);
- "auth": wrong cluster key, other network version, tampered, or moved to another key;
- "replay": an envelope already accepted (or older) from the same sender session;
- "decode": authenticated, but the payload is not msgpack;
- "invalid": authenticated and decoded, but not a valid message of the topic's type;
- "version": a peer announces presence under another NETWORK_VERSION (another build);
- "unproven": a presence token whose session did not prove the cluster key when challenged
  (a token copied by a peer without the key, or a session that stopped answering);
- "oversize": a payload larger than its topic admits, refused before it is copied or opened.

The peer of a "malformed"/"auth" reject is the sender id the header claims (unverified), or
"unknown". The per-peer table is bounded: peers past `MAX_TRACKED_PEERS` are folded into
"other", so a flood of invented sender ids cannot grow memory or the log.

Each (peer, reason) is logged once at WARNING; repeats are only counted. Nothing here may
raise into the receive path.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Final, Literal

log = logging.getLogger("skulk.routing")

Reason = Literal["malformed", "auth", "replay", "decode", "invalid", "version", "unproven", "oversize"]
REASONS: Final[tuple[Reason, ...]] = (
    "malformed", "auth", "replay", "decode", "invalid", "version", "unproven", "oversize",
)

MAX_TRACKED_PEERS: Final = 256
UNKNOWN_PEER: Final = "unknown"
OTHER_PEERS: Final = "other"

_HINTS: Final[dict[str, str]] = {
    "malformed": "not a skulk envelope",
    "auth": "wrong cluster key or other skulk version (NETWORK_VERSION); check --cluster-key on that node",
    "replay": "replayed or reordered envelope",
    "decode": "payload is not msgpack",
    "invalid": "payload does not match the topic's type (other build?)",
    "version": "peer runs another skulk network version; upgrade one side so NETWORK_VERSION matches",
    "unproven": "presence token not backed by the cluster key (copied or replayed token, or a session that stopped "
                "answering); it does not count as a member",
    "oversize": "payload larger than the topic admits (unauthenticated or from another build); dropped unread",
}


class RejectLedger:
    """Thread-safe counters of rejected input, by reason and by peer."""

    def __init__(self, *, max_peers: int = MAX_TRACKED_PEERS) -> None:
        self._max_peers = max_peers
        self._by_reason: Counter[str] = Counter()
        self._by_peer: dict[str, Counter[str]] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def record(self, reason: Reason, peer: str | None, *, where: str, detail: str = "") -> None:
        peer_label = peer or UNKNOWN_PEER
        with self._lock:
            if peer_label not in self._by_peer and len(self._by_peer) >= self._max_peers:
                peer_label = OTHER_PEERS
            self._by_reason[reason] += 1
            self._by_peer.setdefault(peer_label, Counter())[reason] += 1
            first = (peer_label, reason) not in self._logged
            if first:
                self._logged.add((peer_label, reason))
        if first:
            log.warning(
                "rejected %s input from peer %s on %s: %s%s (further rejects of this kind are only counted)",
                reason, peer_label, where, _HINTS[reason], f" [{detail}]" if detail else "",
            )

    def count(self, reason: Reason, peer: str | None = None) -> int:
        with self._lock:
            if peer is None:
                return self._by_reason[reason]
            return self._by_peer.get(peer, Counter())[reason]

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return {
                "byReason": {reason: self._by_reason[reason] for reason in REASONS},
                "byPeer": {peer: dict(counts) for peer, counts in self._by_peer.items()},
            }
