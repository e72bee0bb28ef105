"""The inviting node's book of join invites: issued, redeemed once, forgotten.

Open invites live in this node's memory only: nothing of them reaches State, the event log
or disk, and a restart voids them (the joining node is told so: `unknown`). The book is
bounded: at most `OPEN_INVITES` open at once (expired ones are dropped first; then a new one
is refused), and it remembers the last `REMEMBERED` closed ones, so a second use of a token
is refused as `used` and a late one as `expired` rather than as unknown.

A redemption that proves the token (`join_token.proof_of`) before the expiry gets the
invite's `release` once; the invite is then closed. A wrong proof for an open invite changes
nothing (a guess at 256 bits does not succeed), and is refused as `forged`.

Times are wall-clock Unix seconds passed in by the caller (the token carries its expiry to
another machine). Randomness is a callable, so tests are deterministic.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from skulk.routing.join_token import (
    INVITE_ID_BYTES,
    NONCE_BYTES,
    SECRET_BYTES,
    encode_release,
    encode_token,
    invite_id_of,
    proof_digest,
    proof_of,
    seal_token,
)
from skulk.shared.types.invites import InviteRefused, IssuedInvite

OPEN_INVITES: Final = 32
REMEMBERED: Final = 256


@dataclass
class _Invite:
    expires_at: int
    proof_digest: bytes = field(repr=False)
    release: bytes = field(repr=False)
    closed_at: float | None = None
    joined_by: str = ""


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class InviteBook:
    """Issues and redeems invites for one cluster key. Thread-safe (API routes may run on
    worker threads); every method is quick and never blocks."""

    def __init__(self, cluster_key: str, *, random_bytes: Callable[[int], bytes] = secrets.token_bytes,
                 open_limit: int = OPEN_INVITES, remembered: int = REMEMBERED) -> None:
        self._cluster_key = cluster_key
        self._random = random_bytes
        self._open_limit = open_limit
        self._remembered = remembered
        self._invites: OrderedDict[str, _Invite] = OrderedDict()
        self._lock = threading.Lock()

    def open_count(self, now: float) -> int:
        with self._lock:
            return sum(1 for i in self._invites.values() if i.closed_at is None and now < i.expires_at)

    def issue(self, now: float, ttl_s: float, api_endpoints: Sequence[str], peers: Sequence[str]) -> IssuedInvite:
        """A new invite valid for `ttl_s` from `now`; `InviteRefused("conflict")` when
        `OPEN_INVITES` are already open."""
        with self._lock:
            self._close_expired(now)
            if sum(1 for i in self._invites.values() if i.closed_at is None) >= self._open_limit:
                raise InviteRefused("conflict", f"{self._open_limit} invites are open on this node; use one or "
                                                "wait for them to expire")
            invite_id = invite_id_of(self._random(INVITE_ID_BYTES))
            hold, release = self._random(SECRET_BYTES), self._random(SECRET_BYTES)
            expires_at = int(now + ttl_s)
            token = seal_token(self._cluster_key, invite_id=invite_id, expires_at=expires_at,
                               api_endpoints=tuple(api_endpoints), peers=tuple(peers), hold=hold, release=release,
                               nonce=self._random(NONCE_BYTES))
            self._invites[invite_id] = _Invite(expires_at, proof_digest(proof_of(token)), release)
            self._forget_oldest_closed()
        return IssuedInvite(token=encode_token(token), invite_id=invite_id, expires_at=expires_at,
                            api_endpoints=list(token.api_endpoints), peers=list(token.peers))

    def redeem(self, invite_id: str, proof: str, now: float, joined_by: str = "") -> str:
        """The invite's release (encoded) for a valid proof while it is open; closes it."""
        with self._lock:
            self._close_expired(now)
            invite = self._invites.get(invite_id)
            if invite is None:
                raise InviteRefused("unknown", "the inviting node does not know this invite: it was never issued "
                                               "there, or that node restarted since (invites live in its memory); "
                                               "ask for a new one with `skulk cluster invite`")
            if invite.closed_at is not None and invite.joined_by:
                raise InviteRefused("used", f"this invite was already used at {_when(invite.closed_at)} "
                                            f"(by {invite.joined_by}); an invite admits one machine, ask for a new one")
            if invite.closed_at is not None:
                raise InviteRefused("expired", f"this invite expired at {_when(invite.expires_at)}; "
                                               "ask for a new one with `skulk cluster invite`")
            if not hmac.compare_digest(invite.proof_digest, proof_digest(proof)):
                raise InviteRefused("forged", "the token does not match the one issued under this invite id: it "
                                              "was edited after it was issued")
            invite.closed_at = now
            invite.joined_by = joined_by or "a node"
            release, invite.release = invite.release, b""
        return encode_release(release)

    def _close_expired(self, now: float) -> None:
        for invite in self._invites.values():
            if invite.closed_at is None and now >= invite.expires_at:
                invite.closed_at = float(invite.expires_at)
                invite.release = b""

    def _forget_oldest_closed(self) -> None:
        closed = [k for k, i in self._invites.items() if i.closed_at is not None]
        for invite_id in closed[: max(0, len(closed) - self._remembered)]:
            del self._invites[invite_id]


__all__ = ["OPEN_INVITES", "REMEMBERED", "InviteBook"]
