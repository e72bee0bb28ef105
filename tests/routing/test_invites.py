"""The inviting node's invite book: one redemption per invite, before its expiry, with the
token's own proof; every other case refused with its reason; bounded."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from skulk.routing.invites import InviteBook
from skulk.routing.join_token import decode_release, decode_token, open_token, proof_of
from skulk.shared.types.invites import InviteRefused

KEY = "cluster-key-for-invites"
NOW = 1_800_000_000.0


def _counting_random():
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(4, "big") * (n // 4) + b"\0" * (n % 4)


def _book(**options) -> InviteBook:
    return InviteBook(KEY, random_bytes=_counting_random(), **options)


def _issue(book: InviteBook, ttl_s: float = 600.0):
    issued = book.issue(NOW, ttl_s, ["http://127.0.0.1:1"], ["tcp/127.0.0.1:2"])
    token = decode_token(issued.token)
    return issued, token, proof_of(token)


def _refusal(book: InviteBook, invite_id: str, proof: str, now: float = NOW + 1) -> str:
    with pytest.raises(InviteRefused) as refused:
        book.redeem(invite_id, proof, now, "beta")
    return refused.value.reason


def test_an_invite_admits_one_node_and_opens_its_token():
    book = _book()
    issued, token, proof = _issue(book)
    assert issued.expires_at == int(NOW + 600) and issued.peers == ["tcp/127.0.0.1:2"]
    release = book.redeem(issued.invite_id, proof, NOW + 1, "beta")
    assert open_token(token, decode_release(release)) == KEY
    assert _refusal(book, issued.invite_id, proof, NOW + 2) == "used"


@pytest.mark.parametrize(("case", "reason"), [
    ("late", "expired"),
    ("late_after_a_newer_invite", "expired"),
    ("other_id", "unknown"),
    ("wrong_proof", "forged"),
])
def test_refusals_say_why(case, reason):
    book = _book()
    issued, _token, proof = _issue(book)
    if case == "late":
        assert _refusal(book, issued.invite_id, proof, NOW + 600) == reason
    elif case == "late_after_a_newer_invite":
        book.issue(NOW + 700, 60, ["http://127.0.0.1:1"], [])
        assert _refusal(book, issued.invite_id, proof, NOW + 701) == reason
    elif case == "other_id":
        assert _refusal(book, "nope", proof) == reason
    else:
        assert _refusal(book, issued.invite_id, proof_of(dataclasses.replace(_token, hold=b"z" * 32))) == reason


def test_a_wrong_proof_or_an_edited_token_leaves_the_invite_open_for_its_holder():
    book = _book()
    issued, token, proof = _issue(book)
    assert _refusal(book, issued.invite_id, "guess") == "forged"
    edited = dataclasses.replace(token, peers=("tcp/10.9.9.9:1",))
    assert _refusal(book, issued.invite_id, proof_of(edited)) == "forged"
    assert book.redeem(issued.invite_id, proof, NOW + 1, "beta")


def test_open_invites_are_bounded_and_expired_ones_make_room():
    book = _book(open_limit=2)
    _issue(book, ttl_s=10)
    _issue(book, ttl_s=10)
    with pytest.raises(InviteRefused) as refused:
        _issue(book)
    assert refused.value.reason == "conflict"
    assert book.open_count(NOW) == 2
    book.issue(NOW + 11, 10, ["http://127.0.0.1:1"], [])  # the two expired
    assert book.open_count(NOW + 11) == 1


def test_closed_invites_are_remembered_up_to_a_bound():
    book = _book(remembered=2)
    first, _token, proof = _issue(book, ttl_s=1)
    for _ in range(3):
        book.issue(NOW + 5, 1, ["http://127.0.0.1:1"], [])
        book.issue(NOW + 10, 1, ["http://127.0.0.1:1"], [])
    assert _refusal(book, first.invite_id, proof, NOW + 20) == "unknown"
