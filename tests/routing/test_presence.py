"""Presence tokens: only this cluster's tokens count, and restarts are not departures."""

from __future__ import annotations

import pytest

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION, presence_root
from skulk.routing.presence import (
    PROOF_TIMEOUT_S,
    REPROOF_INTERVAL_S,
    VOUCH_WINDOW_S,
    PresenceChange,
    PresenceRejected,
    PresenceToken,
    PresenceTracker,
    PresenceVerifier,
    parse_presence_key,
    presence_key_material,
    presence_token_key,
    proof_mac,
    proof_wait_s,
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


# -- PresenceVerifier: a token counts only while its session proves the key ------------------
PKEY = b"k" * 32
A1 = PresenceToken("node-a", "s1")
A2 = PresenceToken("node-a", "s2")


def nonces():
    counter = iter(range(10**6))
    return lambda: next(counter).to_bytes(16, "big")


def prove(verifier, challenge, now, key=PKEY):
    return verifier.answered(challenge.token, challenge.nonce, proof_mac(key, challenge.token, challenge.nonce), now)


def test_a_token_counts_only_once_proven():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    assert verifier.alive() == frozenset() and verifier.changes() == []
    (challenge,), failed = verifier.tick(0.0, nonce)
    assert challenge.token == A1 and failed == []
    assert prove(verifier, challenge, 0.1)
    assert verifier.changes() == [PresenceChange("node-a", True)]


@pytest.mark.parametrize(
    ("answer", "accepted"),
    [
        ("right", True),
        ("wrong key", False),  # a peer without the cluster key
        ("old nonce", False),  # a MAC seen on the wire before, replayed
        ("other session", False),
    ],
)
def test_only_a_fresh_mac_under_the_key_proves(answer, accepted):
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    (first,), _ = verifier.tick(0.0, nonce)
    assert prove(verifier, first, 0.1)
    (challenge,), _ = verifier.tick(REPROOF_INTERVAL_S + 0.1, nonce)
    macs = {
        "right": proof_mac(PKEY, A1, challenge.nonce),
        "wrong key": proof_mac(b"x" * 32, A1, challenge.nonce),
        "old nonce": proof_mac(PKEY, A1, first.nonce),
        "other session": proof_mac(PKEY, A2, challenge.nonce),
    }
    assert verifier.answered(A1, challenge.nonce, macs[answer], REPROOF_INTERVAL_S + 0.2) is accepted


def test_a_copied_token_is_dropped_at_the_second_missed_reproof():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    (challenge,), _ = verifier.tick(0.0, nonce)
    prove(verifier, challenge, 0.0)
    verifier.changes()
    # the node dies; a copy of its token keeps the key expression alive, and nobody answers
    t = REPROOF_INTERVAL_S
    (challenge,), failed = verifier.tick(t, nonce)
    assert failed == [] and verifier.alive() == {"node-a"}
    assert verifier.tick(t + PROOF_TIMEOUT_S - 0.01, nonce) == ([], [])
    # one miss: still alive (a stalled live node gets a second chance), challenged again at once
    (second,), failed = verifier.tick(t + PROOF_TIMEOUT_S, nonce)
    assert failed == [] and second.token == A1 and verifier.alive() == {"node-a"}
    t += PROOF_TIMEOUT_S
    challenges, failed = verifier.tick(t + PROOF_TIMEOUT_S, nonce)
    assert failed == [A1] and challenges == []  # retried only after another interval
    assert verifier.changes() == [PresenceChange("node-a", False)]
    # a late answer to a failed challenge changes nothing
    assert not prove(verifier, second, t + PROOF_TIMEOUT_S + 0.1)
    (retry,), _ = verifier.tick(t + PROOF_TIMEOUT_S + REPROOF_INTERVAL_S, nonce)
    assert retry.token == A1


def test_a_live_node_that_misses_one_challenge_stays_alive():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    (challenge,), _ = verifier.tick(0.0, nonce)
    prove(verifier, challenge, 0.0)
    verifier.changes()
    (_missed,), _ = verifier.tick(REPROOF_INTERVAL_S, nonce)
    (again,), failed = verifier.tick(REPROOF_INTERVAL_S + PROOF_TIMEOUT_S, nonce)
    assert failed == [] and prove(verifier, again, REPROOF_INTERVAL_S + PROOF_TIMEOUT_S + 0.1)
    assert verifier.changes() == [] and verifier.alive() == {"node-a"}


def test_a_node_is_alive_while_any_proven_session_holds_a_token():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    verifier.appeared(A2)
    challenges, _ = verifier.tick(0.0, nonce)
    for challenge in challenges:
        prove(verifier, challenge, 0.0)
    assert verifier.changes() == [PresenceChange("node-a", True)]
    verifier.disappeared(A1)
    assert verifier.changes() == []
    verifier.disappeared(A2)
    assert verifier.changes() == [PresenceChange("node-a", False)]


# -- a proven session whose challenges fail but whose sealed messages arrive ------------------
def _two_missed_challenges(verifier, nonce, start):
    """Challenge a proven A1 at `start`, let it and the at-once retry time out; returns the
    (challenges, failed) of the tick that judges the second miss."""
    verifier.tick(start, nonce)  # the reproof challenge, never answered
    verifier.tick(start + PROOF_TIMEOUT_S, nonce)  # first miss: retried at once
    return verifier.tick(start + 2 * PROOF_TIMEOUT_S, nonce)


@pytest.mark.parametrize(
    ("heard", "kept"),
    [
        # zenoh's query path stalls between two live peers (another peer's link was cut) while
        # its pub/sub keeps delivering: a message during the misses keeps the session
        ("during the first challenge", True),
        ("during the retry", True),
        # nothing since the first unanswered challenge: a dead node (or a copied token)
        ("nothing", False),
        ("before the misses", False),
    ],
)
def test_a_proven_session_heard_during_its_missed_challenges_is_kept(heard, kept):
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    (challenge,), _ = verifier.tick(0.0, nonce)
    prove(verifier, challenge, 0.0)
    verifier.changes()
    start = REPROOF_INTERVAL_S
    heard_at = {"during the first challenge": start + 0.5, "during the retry": start + PROOF_TIMEOUT_S + 1.5,
                "before the misses": start - 0.5, "nothing": None}[heard]
    if heard_at is not None:
        verifier.heard(A1, heard_at)
    challenges, failed = _two_missed_challenges(verifier, nonce, start)
    assert (verifier.alive() == {"node-a"}) is kept
    assert (failed == []) is kept
    if kept:  # asked again at once: a fresh answer is still wanted
        assert [c.token for c in challenges] == [A1] and verifier.last_kept == (A1,) and verifier.kept == 1
        assert verifier.changes() == []
    else:
        assert verifier.changes() == [PresenceChange("node-a", False)]


def test_messages_keep_a_session_only_within_the_window_since_its_last_answer():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    (challenge,), _ = verifier.tick(0.0, nonce)
    prove(verifier, challenge, 0.0)
    dropped_at, t = None, REPROOF_INTERVAL_S
    while dropped_at is None and t < 3 * VOUCH_WINDOW_S:
        verifier.heard(A1, t)  # its messages never stop; its challenges are never answered
        _, failed = verifier.tick(t, nonce)
        if failed:
            dropped_at = t
        t += 0.5
    assert dropped_at is not None
    assert VOUCH_WINDOW_S <= dropped_at <= VOUCH_WINDOW_S + 2 * PROOF_TIMEOUT_S + 0.5


def test_messages_never_prove_a_session_that_has_not_answered_once():
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    verifier.tick(0.0, nonce)
    verifier.heard(A1, 0.5)
    _, failed = verifier.tick(PROOF_TIMEOUT_S, nonce)
    assert failed == [A1] and verifier.alive() == frozenset()


def test_messages_from_a_session_without_a_token_change_nothing():
    verifier = PresenceVerifier(PKEY)
    verifier.heard(A1, 1.0)
    assert verifier.alive() == frozenset() and verifier.tick(2.0, nonces()) == ([], [])


def test_only_sessions_heard_at_least_once_are_expected_to_speak() -> None:
    """routing/hearing.py counts a peer's silence only once it has spoken: a node still starting
    (token declared, nothing sent yet) never makes the others deaf."""
    verifier = PresenceVerifier(OURS)
    talker, starting = PresenceToken("talker", "s1"), PresenceToken("starting", "s2")
    verifier.appeared(talker)
    verifier.appeared(starting)
    assert verifier.present_and_heard() == frozenset()
    verifier.heard(talker, 1.0)
    assert verifier.present_and_heard() == {"talker"}
    verifier.disappeared(talker)
    assert verifier.present_and_heard() == frozenset()


def test_last_missed_counts_the_challenges_that_timed_out_in_the_latest_tick():
    """The router kicks zenoh's threads when a challenge goes unanswered (routing/hearing.py)."""
    verifier, nonce = PresenceVerifier(PKEY), nonces()
    verifier.appeared(A1)
    verifier.tick(0.0, nonce)
    assert verifier.last_missed == 0
    verifier.tick(PROOF_TIMEOUT_S - 0.1, nonce)
    assert verifier.last_missed == 0  # still pending
    verifier.tick(PROOF_TIMEOUT_S, nonce)
    assert verifier.last_missed == 1
    verifier.tick(PROOF_TIMEOUT_S + 0.1, nonce)
    assert verifier.last_missed == 0  # counted once, in the tick it timed out


@pytest.mark.parametrize(("name", "others", "watching", "due_at", "wait_s"), [
    ("a peer holds a token: every tick", True, False, 105.0, 0.5),
    ("deaf, or alone where peers are expected: every tick", False, True, 105.0, 0.5),
    ("alone: until the own challenge is due", False, False, 102.0, 2.0),
    ("alone, the challenge overdue: at once", False, False, 99.0, 0.0),
    ("alone, nothing due for long: the longest sleep", False, False, 200.0, 5.0),
    ("no session at all: the longest sleep", False, False, None, 5.0),
])
def test_proof_wait_s(name, others, watching, due_at, wait_s) -> None:
    assert proof_wait_s(others_present=others, watching=watching, due_at=due_at, now=100.0, tick_s=0.5,
                        longest_s=5.0) == wait_s, name


def test_next_due_at_follows_the_challenge_cycle() -> None:
    verifier = PresenceVerifier(OURS)
    assert verifier.next_due_at(0.0) is None
    token = PresenceToken("a", "s1")
    verifier.appeared(token)
    assert verifier.next_due_at(1.0) == 1.0  # never challenged: now
    challenges, _ = verifier.tick(1.0, lambda: b"n" * 16)
    assert verifier.next_due_at(1.5) == 1.0 + verifier.timeout_s  # the pending challenge times out
    verifier.answered(token, challenges[0].nonce, proof_mac(OURS, token, challenges[0].nonce), 1.2)
    assert verifier.next_due_at(1.5) == 1.2 + verifier.reproof_s  # proven: the next proof
    assert verifier.present_nodes() == frozenset({"a"})
    for at in (1.3, 2.0, 4.0):  # nothing to do before then
        assert verifier.tick(at, lambda: b"x" * 16) == ([], [])
