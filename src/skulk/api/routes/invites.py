"""Join invites over HTTP: an operator asks for one, a joining node redeems it.

`POST /v1/cluster/invites` (operator) issues a single-use, expiring join token for this
node's cluster (`skulk cluster invite`, the dashboard's Invite button). `POST
/v1/cluster/join` is the one route a caller without any key may use besides the dashboard's
assets: the invite's proof is its credential, and a valid one gets only the release half
of a wrap key that the token already carries (`skulk.routing.join_token`). Refusals are
typed (`code: invite_<reason>`) so the joining node can say why.
"""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request

from skulk.api.context import api_context
from skulk.api.errors import ApiError, Conflict, Forbidden, InvalidRequest
from skulk.shared.types.invites import InviteRefused, InviteRequest, IssuedInvite, JoinGrant, JoinRequest

log = logging.getLogger(__name__)

router = APIRouter()

INVITES_PATH = "/v1/cluster/invites"
JOIN_PATH = "/v1/cluster/join"


class InvitesUnavailable(ApiError):
    kind = "unavailable"
    default_code = "invites_unavailable"


def _refusal(exc: InviteRefused) -> ApiError:
    code = f"invite_{exc.reason}"
    if exc.reason == "conflict":
        return Conflict(exc.message, code=code)
    if exc.reason == "malformed":
        return InvalidRequest(exc.message, code=code)
    return Forbidden(exc.message, code=code)


@router.post(INVITES_PATH)
def issue_invite(request: Request, body: InviteRequest | None = None) -> IssuedInvite:
    """A new join token, shown once: the node keeps only what redeeming it needs, in memory.
    Sync: reading the interfaces and sockets runs on a worker thread, off the event loop."""
    context = api_context(request)
    if context.issue_invite is None:
        raise InvitesUnavailable("this node issues no invites (it runs without a cluster key)")
    try:
        issued = context.issue_invite((body or InviteRequest()).ttl_seconds)
    except InviteRefused as exc:
        raise _refusal(exc) from None
    log.info("issued join invite %s, valid until %s", issued.invite_id,
             time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(issued.expires_at)))
    return issued


@router.post(JOIN_PATH)
async def redeem_invite(request: Request, body: JoinRequest) -> JoinGrant:
    context = api_context(request)
    if context.redeem_invite is None:
        raise InvitesUnavailable("this node issues no invites (it runs without a cluster key)")
    try:
        release = context.redeem_invite(body)
    except InviteRefused as exc:
        log.warning("refused a join through invite %r from %s: %s", body.invite_id[:32],
                    request.client.host if request.client else "?", exc.reason)
        raise _refusal(exc) from None
    log.info("node %r joined through invite %r", body.node_name, body.invite_id)
    return JoinGrant(release=release)


__all__ = ["INVITES_PATH", "JOIN_PATH", "router"]
