"""The join token: one printable line that lets a new machine join a cluster once.

A token carries, in clear, an invite id, an expiry and the inviting node's reachable
endpoints (its API, where the invite is redeemed, and its transport, the new node's
bootstrap peers), and carries the cluster key *wrapped*: AES-GCM under a key derived from
two halves, one in the token (`hold`) and one that only the inviting node knows
(`release`). The token alone therefore opens nothing: the joining node proves it holds the
token (`proof`, an HMAC of its clear fields under `hold`, so the token itself never crosses
the wire and an edited token is refused before anything is released),
and the inviting node hands out `release` once, while the invite is open. Used, expired and
unknown invites get nothing, so a token that leaked after use is worthless. The clear fields
are the AES-GCM associated data: a token whose endpoints or expiry were edited does not open.

Pure: bytes in, bytes out; randomness is passed in by the caller. Never log a token, `hold`,
`release` or a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.shared.types.invites import InviteRefused

TOKEN_PREFIX: Final = "skulk-join1-"
MAX_TOKEN_CHARS: Final = 4096
MAX_ENDPOINTS: Final = 6
"""Endpoints of each kind a token carries (the first ones are tried first)."""
SECRET_BYTES: Final = 32
INVITE_ID_BYTES: Final = 16
NONCE_BYTES: Final = 12

_WRAP_SALT: Final = b"skulk/join/v1"
_WRAP_INFO: Final = b"skulk join wrap|"
_PROOF_INFO: Final = b"skulk join proof|"


@dataclass(frozen=True)
class JoinToken:
    invite_id: str
    expires_at: int
    """Unix seconds, by the inviting node's clock."""
    api_endpoints: tuple[str, ...]
    peers: tuple[str, ...]
    hold: bytes = field(repr=False)
    wrapped_key: bytes = field(repr=False)
    """nonce + AES-GCM(cluster key)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _clear_fields(invite_id: str, expires_at: int, api_endpoints: tuple[str, ...], peers: tuple[str, ...]) -> bytes:
    """The associated data: the token's clear fields, canonically."""
    return json.dumps({"a": list(api_endpoints), "i": invite_id, "p": list(peers), "x": expires_at},
                      sort_keys=True, separators=(",", ":")).encode("utf-8")


def _wrap_key(hold: bytes, release: bytes, invite_id: str) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_WRAP_SALT, info=_WRAP_INFO + invite_id.encode("ascii"))
    return hkdf.derive(hold + release)


def proof_of(token: JoinToken) -> str:
    """What a joining node sends to show it holds the token, without sending the token: an
    HMAC under `hold` of the invite id and every clear field, so the inviting node refuses an
    edited token before it releases anything (and the invite stays open for the real one)."""
    clear = _clear_fields(token.invite_id, token.expires_at, token.api_endpoints, token.peers)
    message = _PROOF_INFO + token.invite_id.encode("ascii") + b"|" + hashlib.sha256(clear).digest()
    return _b64(hmac.new(token.hold, message, hashlib.sha256).digest())


def proof_digest(proof: str) -> bytes:
    """What the inviting node keeps of a proof (compared in constant time, never the proof)."""
    return hashlib.sha256(proof.encode("ascii", errors="replace")).digest()


def seal_token(
    cluster_key: str, *, invite_id: str, expires_at: int, api_endpoints: tuple[str, ...], peers: tuple[str, ...],
    hold: bytes, release: bytes, nonce: bytes,
) -> JoinToken:
    """A token for one invite, with the cluster key wrapped under `hold` and `release`."""
    if not api_endpoints:
        raise ValueError("a join token needs at least one API endpoint to redeem it at")
    api_endpoints, peers = api_endpoints[:MAX_ENDPOINTS], peers[:MAX_ENDPOINTS]
    sealed = AESGCM(_wrap_key(hold, release, invite_id)).encrypt(
        nonce, cluster_key.encode("utf-8"), _clear_fields(invite_id, expires_at, api_endpoints, peers))
    return JoinToken(invite_id, expires_at, api_endpoints, peers, hold, nonce + sealed)


def encode_token(token: JoinToken) -> str:
    body = {"i": token.invite_id, "x": token.expires_at, "a": list(token.api_endpoints), "p": list(token.peers),
            "h": _b64(token.hold), "w": _b64(token.wrapped_key)}
    return TOKEN_PREFIX + _b64(json.dumps(body, separators=(",", ":")).encode("utf-8"))


def _malformed(why: str) -> InviteRefused:
    return InviteRefused("malformed", f"this is not a Skulk join token ({why}); copy the whole last line "
                                      "`skulk cluster invite` printed")


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 256 for v in value):
        raise _malformed(f"bad {what}")
    return tuple(value)[:MAX_ENDPOINTS]


def decode_token(text: str) -> JoinToken:
    """Parse a token as pasted (surrounding whitespace ignored); `InviteRefused("malformed")`
    for anything else. Says nothing of whether it is genuine: only redeeming shows that."""
    text = text.strip()
    if not text.startswith(TOKEN_PREFIX):
        raise _malformed(f"it does not start with {TOKEN_PREFIX}")
    if len(text) > MAX_TOKEN_CHARS:
        raise _malformed("too long")
    try:
        body = json.loads(_unb64(text[len(TOKEN_PREFIX):]))
        hold, wrapped = _unb64(body["h"]), _unb64(body["w"])
        invite_id, expires_at = body["i"], body["x"]
    except (ValueError, binascii.Error, KeyError, TypeError, UnicodeDecodeError):
        raise _malformed("it does not decode; was it cut short?") from None
    if not isinstance(invite_id, str) or not invite_id.isascii() or not 0 < len(invite_id) <= 64:
        raise _malformed("bad invite id")
    if not isinstance(expires_at, int) or isinstance(expires_at, bool):
        raise _malformed("bad expiry")
    if len(hold) != SECRET_BYTES or len(wrapped) <= NONCE_BYTES:
        raise _malformed("bad key material")
    api_endpoints = _strings(body.get("a"), "API endpoints")
    if not api_endpoints:
        raise _malformed("no API endpoint")
    return JoinToken(invite_id, expires_at, api_endpoints, _strings(body.get("p", []), "peers"), hold, wrapped)


def open_token(token: JoinToken, release: bytes) -> str:
    """The cluster key inside `token`, given the inviting node's `release`. A token edited
    since it was issued, or a release for another invite, raises `InviteRefused("forged")`."""
    nonce, sealed = token.wrapped_key[:NONCE_BYTES], token.wrapped_key[NONCE_BYTES:]
    aad = _clear_fields(token.invite_id, token.expires_at, token.api_endpoints, token.peers)
    try:
        key = AESGCM(_wrap_key(token.hold, release, token.invite_id)).decrypt(nonce, sealed, aad)
    except (InvalidTag, ValueError):
        raise InviteRefused("forged", "the token does not open with the inviting node's answer: it was edited "
                                      "after it was issued, or it is not the one this node issued") from None
    return key.decode("utf-8")


def invite_id_of(raw: bytes) -> str:
    """An invite id: random bytes, printable."""
    return _b64(raw)


def encode_release(release: bytes) -> str:
    return _b64(release)


def decode_release(text: str) -> bytes:
    try:
        release = _unb64(text)
    except (ValueError, binascii.Error):
        raise InviteRefused("forged", "the inviting node's answer is not a release") from None
    if len(release) != SECRET_BYTES:
        raise InviteRefused("forged", "the inviting node's answer is not a release")
    return release


__all__ = [
    "MAX_ENDPOINTS", "SECRET_BYTES", "TOKEN_PREFIX", "JoinToken", "decode_release", "decode_token", "encode_release",
    "encode_token", "invite_id_of", "open_token", "proof_digest", "proof_of", "seal_token",
]
