"""The joining side: it proves the token at each endpoint in turn, relays the inviter's typed
refusals, keeps the key (0600) and the peers, and sets aside a key it replaces."""

from __future__ import annotations

import io
import json
import stat

import httpx
import pytest

from skulk.routing.invites import InviteBook
from skulk.routing.join_token import decode_token
from skulk.routing.joining import (
    JOINED_FILE,
    Joined,
    join_cluster,
    joined_peers,
    read_token,
    redeem,
    store_joined,
)
from skulk.shared.types.invites import InviteRefused

NOW = 1_800_000_000.0


def _issued(book: InviteBook, endpoints=("http://a:1", "http://b:2")):
    return decode_token(book.issue(NOW, 600, list(endpoints), ["tcp/a:7447"]).token)


def test_redeem_tries_each_endpoint_and_opens_the_key():
    book = InviteBook("k1")
    token = _issued(book)
    calls: list[str] = []

    def post(url, body):
        calls.append(url)
        if url.startswith("http://a"):
            raise httpx.ConnectError("refused")
        return 200, {"release": book.redeem(body["inviteId"], body["proof"], NOW, body["nodeName"])}

    joined = redeem(token, "beta", NOW, post)
    assert calls == ["http://a:1/v1/cluster/join", "http://b:2/v1/cluster/join"]
    assert joined.cluster_key == "k1" and joined.peers == ("tcp/a:7447",) and joined.inviter == "http://b:2"
    assert "k1" not in repr(joined)


@pytest.mark.parametrize(("status", "body", "reason"), [
    (403, {"code": "invite_used", "detail": "already used"}, "used"),
    (403, {"code": "invite_expired", "detail": "expired"}, "expired"),
    (403, {"code": "invite_unknown", "detail": "?"}, "unknown"),
    (500, {"detail": "boom"}, "unreachable"),
    (200, {"release": "c2hvcnQ"}, "forged"),
])
def test_redeem_relays_refusals(status, body, reason):
    token = _issued(InviteBook("k1"), endpoints=("http://a:1",))
    with pytest.raises(InviteRefused) as refused:
        redeem(token, "beta", NOW, lambda _url, _body: (status, body))
    assert refused.value.reason == reason


def test_a_clearly_expired_token_is_refused_without_asking():
    token = _issued(InviteBook("k1"))
    with pytest.raises(InviteRefused) as refused:
        redeem(token, "beta", NOW + 3600, lambda *_: pytest.fail("asked"))
    assert refused.value.reason == "expired"


def test_store_keeps_the_key_private_and_sets_aside_another(tmp_path):
    (tmp_path / "cluster.key").write_text("old-key\n")
    joined = Joined(cluster_key="new-key", invite_id="i", peers=("tcp/a:7447",), inviter="http://a:1")
    assert store_joined(tmp_path, joined) is True
    key_file = tmp_path / "cluster.key"
    assert key_file.read_text().strip() == "new-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert (tmp_path / "cluster.key.replaced").read_text().strip() == "old-key"
    assert joined_peers(tmp_path) == ("tcp/a:7447",)
    assert "new-key" not in (tmp_path / JOINED_FILE).read_text()
    assert store_joined(tmp_path, joined) is False  # the same key again: nothing set aside


def test_joined_peers_of_a_missing_or_broken_record(tmp_path):
    assert joined_peers(tmp_path) == ()
    (tmp_path / JOINED_FILE).write_text(json.dumps({"bootstrapPeers": "tcp/x:1"}))
    assert joined_peers(tmp_path) == ()


def test_read_token_from_flag_file_or_stdin(tmp_path):
    path = tmp_path / "t"
    path.write_text("skulk-join1-x\n")
    assert read_token("tok", None, lambda: "") == "tok"
    assert read_token(None, path, lambda: "") == "skulk-join1-x\n"
    assert read_token("-", None, io.StringIO("from-stdin\n").read) == "from-stdin\n"
    assert read_token(None, None, lambda: "") is None
    with pytest.raises(InviteRefused) as refused:
        read_token("tok", path, lambda: "")
    assert refused.value.reason == "conflict"
    with pytest.raises(InviteRefused):
        read_token(None, tmp_path / "missing", lambda: "")


def test_a_token_already_joined_with_is_not_redeemed_again(tmp_path):
    book = InviteBook("k1")
    text = book.issue(NOW, 10**9, ["http://a:1"], ["tcp/a:7447"]).token
    answer = lambda _url, body: (200, {"release": book.redeem(body["inviteId"], body["proof"], NOW)})  # noqa: E731
    joined = join_cluster(text, tmp_path, "beta", answer)
    assert joined is not None and joined.cluster_key == "k1"
    assert join_cluster(text, tmp_path, "beta", lambda *_: pytest.fail("redeemed twice")) is None
    assert (tmp_path / "cluster.key").read_text().strip() == "k1"
