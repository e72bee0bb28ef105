"""Presence tokens: which nodes of this cluster are alive, from zenoh liveliness.

A node declares one liveliness token `skulk/<ver>/presence/<node>/<session>/<tag>`. Tokens
carry no payload, so they cannot be sealed; instead `tag` is a truncated HMAC of
(node, session) under a key derived from the wire key. A node with another cluster key or
another network version produces tokens that fail the tag check: they are counted as "auth"
rejects and never reported as members.

A token's key is visible to every zenoh peer, so a peer without the key could copy a valid
one and re-declare it, keeping a dead node (an old master) looking alive. So a token only
counts while its session proves it holds the key: each watcher sends a fresh random nonce to
the session's proof queryable (`proof_key_expr`) and accepts only a MAC of that nonce under
the presence key (`proof_mac`), at first sight and again every `REPROOF_INTERVAL_S`. A copied
token never answers; its node is reported gone at the first failed proof (`PresenceVerifier`).

A challenge can also go unanswered while its session is alive and reachable: while a THIRD
peer's cable was cut, zenoh's traffic from the master to a healthy peer stalled for the whole
cut although their link stayed up (measured on `tests/cluster/test_network_cut.py`: the
master's challenges to the serving node and that node's to the master all timed out, and the
master's state events reached it only at the heal, while the master's event loop ran on time,
none of its puts blocked, and the serving node's own messages kept reaching the master). So
a sealed message from the session (authenticated under the wire key, replay-checked: only a
holder of the key can produce one) is evidence too: a proven session whose challenges fail
is kept while its messages keep arriving (`heard`), for at most VOUCH_WINDOW_S since its last
answered challenge. A dead or frozen node sends nothing and is dropped as before.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.routing.constants import NETWORK_VERSION, is_valid_id, presence_root

# 16 bytes of HMAC-SHA256 (128 bits): far beyond guessing, short enough for a key chunk.
TAG_BYTES: Final = 16
_PRESENCE_KEY_INFO: Final = b"skulk presence tag|"

PROOF_SEGMENT: Final = "proof"
NONCE_BYTES: Final = 16
"""Random bytes per challenge: a MAC seen once is never asked for again."""
MAC_BYTES: Final = 32
"""An answer is a full HMAC-SHA256; any other length is refused before it is read."""
PROOF_TIMEOUT_S: Final = 2.0
"""A challenge unanswered this long fails: a live peer answers within milliseconds on a LAN
(zenoh answers queries on its own threads, whatever the node's event loop is doing)."""
REPROOF_INTERVAL_S: Final = 3.0
"""How often a proven session is challenged again. A copied token whose node died (and whose
own token's disappearance zenoh did not report, because the copy still holds the key
expression) is reported gone within REPROOF_INTERVAL_S + MISSED_PROOFS_TO_DROP x PROOF_TIMEOUT_S."""
MISSED_PROOFS_TO_DROP: Final = 2
"""Consecutive unanswered challenges before a proven session counts as gone; the first miss is
re-challenged at once. One miss is not enough: the master prunes a node within a second of
its presence going (`skulk.master.presence_loss`), and a live node on a machine stalled for a
moment (swap, a GIL-heavy burst) must not have its instances re-placed for it."""


VOUCH_WINDOW_S: Final = 30.0
"""How long a proven session whose challenges go unanswered is kept on the strength of its
sealed messages alone. Past this a fresh answer is required again, so an on-path peer that
withholds a dead node's last envelopes and releases them one by one cannot keep a copied token
alive for longer than the master's silence timeout would anyway."""


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


def proof_key_expr(node_id: str, session_id: str, *, network_version: str = NETWORK_VERSION) -> str:
    """Where a session answers presence challenges (a queryable, not a liveliness token)."""
    return f"{presence_root(network_version)}/{node_id}/{session_id}/{PROOF_SEGMENT}"


def proof_mac(presence_key: bytes, token: PresenceToken, nonce: bytes) -> bytes:
    """The answer to a challenge: HMAC-SHA256 over the session and the challenger's nonce."""
    message = b"proof\x00" + f"{token.node_id}\x00{token.session_id}\x00".encode() + nonce
    return hmac.new(presence_key, message, hashlib.sha256).digest()


@dataclass(slots=True)
class _Session:
    present: bool = True
    proven_at: float | None = None
    failed_at: float | None = None
    pending: tuple[bytes, float] | None = None  # (nonce, sent at)
    misses: int = 0
    missed_since: float | None = None  # when the first challenge of the current misses was sent
    heard_at: float | None = None  # the latest sealed message from this session


@dataclass(frozen=True, slots=True)
class Challenge:
    token: PresenceToken
    nonce: bytes


@dataclass(slots=True)
class PresenceVerifier:
    """Which sessions have proven the key lately; node-level alive/dead changes from that.

    Pure: the shell passes `now` and a nonce source, sends the `Challenge`s `tick` returns,
    reports answers with `answered` and sealed messages with `heard`. A node is alive while one of its sessions holds a
    token (per zenoh) and answered its last challenge. Not thread-safe: the shell locks."""

    presence_key: bytes
    timeout_s: float = PROOF_TIMEOUT_S
    reproof_s: float = REPROOF_INTERVAL_S
    kept: int = 0
    """How many times a session's failed challenges were forgiven because its messages arrived."""
    last_kept: tuple[PresenceToken, ...] = ()
    """The sessions the last `tick` kept that way (for the shell to log)."""
    last_missed: int = 0
    """Challenges that went unanswered in the latest `tick` (a dead peer, or a stalled link)."""
    _sessions: dict[PresenceToken, _Session] = field(default_factory=dict)
    _reported: frozenset[str] = frozenset()

    def appeared(self, token: PresenceToken) -> None:
        session = self._sessions.setdefault(token, _Session())
        session.present = True

    def disappeared(self, token: PresenceToken) -> None:
        self._sessions.pop(token, None)

    def heard(self, token: PresenceToken, now: float) -> None:
        """A sealed message from this session arrived at `now` (evidence of life, see module notes)."""
        session = self._sessions.get(token)
        if session is not None and (session.heard_at is None or now > session.heard_at):
            session.heard_at = now

    def _kept_by_messages(self, session: _Session, now: float) -> bool:
        """A proven session whose challenges failed, but whose messages arrived meanwhile."""
        return (session.proven_at is not None and session.missed_since is not None
                and session.heard_at is not None and session.heard_at >= session.missed_since
                and now - session.proven_at < VOUCH_WINDOW_S)

    def tick(self, now: float, new_nonce: Callable[[], bytes]) -> tuple[list[Challenge], list[PresenceToken]]:
        """Challenges to send now, and the tokens whose challenge just failed (to count)."""
        challenges: list[Challenge] = []
        failed: list[PresenceToken] = []
        kept: list[PresenceToken] = []
        missed = 0
        for token, session in self._sessions.items():
            retry_now = False
            if session.pending is not None and now - session.pending[1] >= self.timeout_s:
                missed += 1
                if session.missed_since is None:
                    session.missed_since = session.pending[1]
                session.pending = None
                session.misses += 1
                if session.proven_at is not None and session.misses >= MISSED_PROOFS_TO_DROP \
                        and self._kept_by_messages(session, now):
                    # alive by its messages: forgive the misses, keep asking for a fresh answer
                    session.misses, session.missed_since, retry_now = 0, None, True
                    kept.append(token)
                elif session.proven_at is None or session.misses >= MISSED_PROOFS_TO_DROP:
                    session.proven_at, session.failed_at, session.misses, session.missed_since = None, now, 0, None
                    failed.append(token)
                else:
                    retry_now = True  # a proven session gets a second chance at once
            if session.pending is not None:
                continue
            last = session.proven_at if session.proven_at is not None else session.failed_at
            if retry_now or last is None or now - last >= self.reproof_s:
                nonce = new_nonce()
                session.pending = (nonce, now)
                challenges.append(Challenge(token, nonce))
        self.last_kept = tuple(kept)
        self.last_missed = missed
        self.kept += len(kept)
        return challenges, failed

    def answered(self, token: PresenceToken, nonce: bytes, mac: bytes, now: float) -> bool:
        """True when `mac` answers the pending challenge of `token` (the session is proven)."""
        session = self._sessions.get(token)
        if session is None or session.pending is None or not hmac.compare_digest(session.pending[0], nonce):
            return False
        if not hmac.compare_digest(mac, proof_mac(self.presence_key, token, nonce)):
            return False
        session.pending, session.proven_at, session.failed_at, session.misses = None, now, None, 0
        session.missed_since = None
        return True

    def alive(self) -> frozenset[str]:
        return frozenset(t.node_id for t, s in self._sessions.items() if s.present and s.proven_at is not None)

    def present_nodes(self) -> frozenset[str]:
        """Nodes holding a token, proven or not."""
        return frozenset(t.node_id for t, s in self._sessions.items() if s.present)

    def next_due_at(self, now: float) -> float | None:
        """When `tick` next has something to do (a pending challenge times out, or a session
        is due a fresh challenge); None with no session. `now` for a session never
        challenged."""
        due: list[float] = []
        for session in self._sessions.values():
            if session.pending is not None:
                due.append(session.pending[1] + self.timeout_s)
                continue
            last = session.proven_at if session.proven_at is not None else session.failed_at
            due.append(now if last is None else last + self.reproof_s)
        return min(due, default=None)

    def present_and_heard(self) -> frozenset[str]:
        """Nodes holding a token (proven or not) whose session has spoken at least once: who
        should be heard from. A node still starting (token declared, nothing sent yet) is left
        out, so its silence never makes this node deaf (routing/hearing.py)."""
        return frozenset(t.node_id for t, s in self._sessions.items() if s.present and s.heard_at is not None)

    def changes(self) -> list[PresenceChange]:
        """Node-level changes since the last call (alive first, then departures)."""
        now_alive = self.alive()
        before, self._reported = self._reported, now_alive
        return ([PresenceChange(node, True) for node in sorted(now_alive - before)]
                + [PresenceChange(node, False) for node in sorted(before - now_alive)])


def proof_wait_s(*, others_present: bool, watching: bool, due_at: float | None, now: float, tick_s: float,
                 longest_s: float) -> float:
    """How long the router's proof loop may sleep. `tick_s` while another node holds a
    token (its challenges, and this node's hearing of it, are judged every tick) or while
    `watching` (deaf, or alone where peers are expected: the kicks in routing/hearing.py
    need the clock); otherwise, a node alone on its network, until its own session's next
    challenge is due (`due_at`), at most `longest_s`. A token that appears wakes the loop
    at once whatever this says."""
    if others_present or watching:
        return tick_s
    if due_at is None:
        return longest_s
    return min(longest_s, max(0.0, due_at - now))


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
