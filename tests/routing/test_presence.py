"""Presence tokens: only this cluster's tokens count, and restarts are not departures."""

from __future__ import annotations

import pytest

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION, presence_root
from skulk.routing.presence import (
    PresenceChange,
    PresenceRejected,
    PresenceToken,
    PresenceTracker,
    parse_presence_key,
    presence_key_material,
    presence_token_key,
)

OURS = presence_key_material(derive_wire_key("cluster-a", NETWORK_VERSION))
THEIRS = presence_key_material(derive_wire_key("cluster-b", NETWORK_VERSION))


def test_token_key_round_trips() -> None:
    key = presence_token_key(OURS, "node-a", "s1")
    assert key.startswith(presence_root() + "/node-a/s1/")
    assert parse_presence_key(OURS, key) == PresenceToken("node-a", "s1")


def test_token_of_another_cluster_is_auth() -> None:
    with pytest.raises(PresenceRejected) as info:
        parse_presence_key(OURS, presence_token_key(THEIRS, "node-x", "s1"))
    assert (info.value.reason, info.value.claimed_node) == ("auth", "node-x")


def test_token_moved_to_another_node_is_auth() -> None:
    tag = presence_token_key(OURS, "node-a", "s1").rsplit("/", 1)[1]
    with pytest.raises(PresenceRejected) as info:
        parse_presence_key(OURS, f"{presence_root()}/node-b/s1/{tag}")
    assert info.value.reason == "auth"


@pytest.mark.parametrize("suffix", ["node-a", "node-a/s1", "node-a/s1/tag/extra", "@x/s1/tag"])
def test_misshapen_tokens_are_malformed(suffix) -> None:
    with pytest.raises(PresenceRejected) as info:
        parse_presence_key(OURS, f"{presence_root()}/{suffix}")
    assert info.value.reason == "malformed"


def test_node_stays_alive_while_any_session_holds_a_token() -> None:
    tracker = PresenceTracker()
    old, new = PresenceToken("n", "boot-1"), PresenceToken("n", "boot-2")
    assert tracker.appeared(old) == PresenceChange("n", True)
    assert tracker.appeared(new) is None  # restart: new token before the old one expired
    assert tracker.disappeared(old) is None
    assert tracker.alive() == frozenset({"n"})
    assert tracker.disappeared(new) == PresenceChange("n", False)
    assert tracker.alive() == frozenset()
    assert tracker.disappeared(new) is None  # duplicate delete changes nothing
