"""The join token: it round-trips, opens only with its own release, and refuses edits and
garbage as `forged` or `malformed` (pure, table-driven)."""

from __future__ import annotations

import base64
import json

import pytest

from skulk.routing.join_token import (
    TOKEN_PREFIX,
    decode_release,
    decode_token,
    encode_token,
    open_token,
    proof_of,
    seal_token,
)
from skulk.shared.types.invites import InviteRefused

KEY = "the-cluster-key"
HOLD, RELEASE, NONCE = b"h" * 32, b"r" * 32, b"n" * 12


def _token(**overrides):
    fields = {"invite_id": "abc", "expires_at": 1_900_000_000, "api_endpoints": ("http://10.0.0.2:52415",),
              "peers": ("tcp/10.0.0.2:7447",), "hold": HOLD, "release": RELEASE, "nonce": NONCE} | overrides
    return seal_token(KEY, **fields)


def _edit(text: str, **fields) -> str:
    body = json.loads(base64.urlsafe_b64decode(text[len(TOKEN_PREFIX):] + "=="))
    body.update(fields)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def test_a_token_round_trips_and_opens_with_its_release():
    text = encode_token(_token())
    assert text.startswith(TOKEN_PREFIX) and KEY not in text and len(text) < 600
    token = decode_token(f"  {text}\n")
    assert token.api_endpoints == ("http://10.0.0.2:52415",) and token.peers == ("tcp/10.0.0.2:7447",)
    assert open_token(token, RELEASE) == KEY


def test_the_proof_is_not_the_hold_and_covers_every_clear_field():
    proof = proof_of(_token())
    assert base64.urlsafe_b64encode(HOLD).decode().rstrip("=") not in proof
    for edit in ({"invite_id": "abd"}, {"expires_at": 1}, {"api_endpoints": ("http://x:1",)}, {"peers": ()}):
        assert proof_of(_token(**edit)) != proof


@pytest.mark.parametrize("edit", [
    {"a": ["http://evil.example:52415"]},
    {"p": ["tcp/evil.example:7447"]},
    {"x": 2_000_000_000},
])
def test_an_edited_token_does_not_open(edit):
    token = decode_token(_edit(encode_token(_token()), **edit))
    with pytest.raises(InviteRefused) as refused:
        open_token(token, RELEASE)
    assert refused.value.reason == "forged"


def test_a_wrong_release_does_not_open():
    with pytest.raises(InviteRefused) as refused:
        open_token(decode_token(encode_token(_token())), b"x" * 32)
    assert refused.value.reason == "forged"


@pytest.mark.parametrize("text", [
    "",
    "hello",
    TOKEN_PREFIX,
    TOKEN_PREFIX + "!!!",
    TOKEN_PREFIX + base64.urlsafe_b64encode(b"[1,2]").decode(),
    "skulk-join1-" + "A" * 5000,
])
def test_garbage_is_malformed(text):
    with pytest.raises(InviteRefused) as refused:
        decode_token(text)
    assert refused.value.reason == "malformed"


@pytest.mark.parametrize("edit", [{"a": []}, {"a": "http://x"}, {"x": "soon"}, {"h": "c2hvcnQ"}, {"i": ""}])
def test_a_token_missing_what_it_needs_is_malformed(edit):
    with pytest.raises(InviteRefused) as refused:
        decode_token(_edit(encode_token(_token()), **edit))
    assert refused.value.reason == "malformed"


def test_a_cut_token_says_so():
    text = encode_token(_token())
    with pytest.raises(InviteRefused, match="cut short"):
        decode_token(text[: len(text) // 2])


def test_a_release_of_the_wrong_size_is_refused():
    with pytest.raises(InviteRefused):
        decode_release("c2hvcnQ")
    assert decode_release(base64.urlsafe_b64encode(RELEASE).decode()) == RELEASE
