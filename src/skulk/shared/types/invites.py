"""Join invites: what an operator asks for, what a joining node sends, and every refusal.

An invite lets one new machine join with a single line (`skulk run --join TOKEN`) instead of
copying the cluster key by hand. The token format and its cryptography are in
`skulk.routing.join_token`; the inviting node's bounded book of open invites is
`skulk.routing.invites`. These types are the HTTP bodies between them
(`POST /v1/cluster/invites`, `POST /v1/cluster/join`) and the one refusal type both sides
raise, so an expired, used or forged token is refused with the same reason wherever it is
found out. Nothing here holds the cluster key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from skulk.shared.types.base import WireModel

InviteRefusalReason = Literal["malformed", "expired", "used", "unknown", "forged", "unreachable", "conflict"]
"""Why a join token was refused:
- malformed: not a join token (cut short when copied, or not ours);
- expired: past its expiry (checked by the inviting node, and locally when clearly past);
- used: already redeemed once (an invite admits one machine);
- unknown: the inviting node never issued it, or it restarted since (open invites live in
  its memory only);
- forged: the token does not match what the inviting node issued under that id;
- unreachable: none of the token's API endpoints answered;
- conflict: the join cannot be combined with what else was given (a cluster key)."""

MIN_INVITE_TTL_S = 1.0
MAX_INVITE_TTL_S = 24 * 3600.0
DEFAULT_INVITE_TTL_S = 15 * 60.0


class InviteRefused(Exception):
    """A join token that cannot be used, and why (`reason`), in words an operator can act on."""

    def __init__(self, reason: InviteRefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason: InviteRefusalReason = reason
        self.message = message


class InviteRequest(WireModel):
    """`POST /v1/cluster/invites`: how long the invite stays valid."""

    ttl_seconds: float = Field(default=DEFAULT_INVITE_TTL_S, ge=MIN_INVITE_TTL_S, le=MAX_INVITE_TTL_S)


class IssuedInvite(WireModel):
    """The answer to an invite request: the token (shown once, never stored by the node) and
    what it carries in clear, for the operator to check before handing it over."""

    token: str
    invite_id: str
    expires_at: float
    """Unix seconds, by the inviting node's clock."""
    api_endpoints: list[str]
    peers: list[str]


class JoinRequest(WireModel):
    """`POST /v1/cluster/join`, sent by a joining node: the invite's id and a proof that it
    holds the token (never the token itself), and its name for the inviter's log."""

    invite_id: str = Field(max_length=64)
    proof: str = Field(max_length=128)
    node_name: str = Field(default="", max_length=128)


class JoinGrant(WireModel):
    """The inviting node's answer to a valid proof: the release half of the wrap key, given
    once. With the token's own half it unwraps the cluster key the token carries."""

    release: str


__all__ = [
    "DEFAULT_INVITE_TTL_S", "MAX_INVITE_TTL_S", "MIN_INVITE_TTL_S", "InviteRefusalReason", "InviteRefused",
    "InviteRequest", "IssuedInvite", "JoinGrant", "JoinRequest",
]
