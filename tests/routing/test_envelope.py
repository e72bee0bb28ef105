"""Sealed envelopes: what a receiver accepts, and the one typed reason it gives for anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION, topic_key
from skulk.routing.envelope import ENVELOPE_FORMAT, EnvelopeRejected, Opener, Sealer

KEY = derive_wire_key("cluster-a", NETWORK_VERSION)
TOPIC = topic_key("global_events")


def reject_reason(opener: Opener, topic: str, envelope: bytes) -> str:
    with pytest.raises(EnvelopeRejected) as info:
        opener.open(topic, envelope)
    return info.value.reason


def test_round_trip_carries_payload_sender_session_and_seq() -> None:
    sealer = Sealer(KEY, "node-a", "s1")
    opener = Opener(KEY)
    for expected_seq, payload in enumerate([b"first", b"", b"\x00" * 70_000], start=1):
        opened = opener.open(TOPIC, sealer.seal(TOPIC, payload))
        assert (opened.sender, opened.session, opened.seq, opened.payload) == ("node-a", "s1", expected_seq, payload)


def test_envelope_starts_with_format_byte_and_does_not_leak_payload() -> None:
    envelope = Sealer(KEY, "node-a", "s1").seal(TOPIC, b"secret-model-output")
    assert envelope[0] == ENVELOPE_FORMAT
    assert b"secret-model-output" not in envelope


def test_wrong_cluster_key_is_auth() -> None:
    envelope = Sealer(derive_wire_key("cluster-b", NETWORK_VERSION), "node-x", "s1").seal(TOPIC, b"hi")
    assert reject_reason(Opener(KEY), TOPIC, envelope) == "auth"


def test_other_network_version_is_auth() -> None:
    other_build = derive_wire_key("cluster-a", "skulk-net-0")
    assert other_build != KEY
    envelope = Sealer(other_build, "node-old", "s1").seal(TOPIC, b"hi")
    with pytest.raises(EnvelopeRejected) as info:
        Opener(KEY).open(TOPIC, envelope)
    assert info.value.reason == "auth"
    assert info.value.claimed_sender == "node-old"


def test_moved_to_another_topic_or_node_key_is_auth() -> None:
    sealer = Sealer(KEY, "node-a", "s1")
    envelope = sealer.seal(topic_key("data", "node-b"), b"for b only")
    assert reject_reason(Opener(KEY), topic_key("data", "node-c"), envelope) == "auth"
    assert reject_reason(Opener(KEY), topic_key("commands"), envelope) == "auth"


def test_every_flipped_bit_position_is_rejected() -> None:
    envelope = Sealer(KEY, "node-a", "s1").seal(TOPIC, b"payload")
    for index in range(len(envelope)):
        for mask in (0x01, 0x80):
            tampered = bytearray(envelope)
            tampered[index] ^= mask
            # a fresh opener each time, so only tampering (never replay) can reject it
            assert reject_reason(Opener(KEY), TOPIC, bytes(tampered)) in {"malformed", "auth"}, (index, mask)


def test_every_truncation_is_rejected() -> None:
    envelope = Sealer(KEY, "node-a", "s1").seal(TOPIC, b"payload")
    for length in range(len(envelope)):
        assert reject_reason(Opener(KEY), TOPIC, envelope[:length]) in {"malformed", "auth"}, length


def test_trailing_bytes_are_rejected() -> None:
    envelope = Sealer(KEY, "node-a", "s1").seal(TOPIC, b"payload")
    assert reject_reason(Opener(KEY), TOPIC, envelope + b"x") == "auth"


def test_empty_is_malformed() -> None:
    assert reject_reason(Opener(KEY), TOPIC, b"") == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_garbage_is_always_a_typed_reject(garbage: bytes) -> None:
    assert reject_reason(Opener(KEY), TOPIC, garbage) in {"malformed", "auth"}


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_behind_a_valid_format_byte_is_a_typed_reject(tail: bytes) -> None:
    assert reject_reason(Opener(KEY), TOPIC, bytes([ENVELOPE_FORMAT]) + tail) in {"malformed", "auth"}


def test_header_of_wrong_shape_is_malformed() -> None:
    import msgpack

    for header in ([1, 2, 3], {"sender": "a", "session": "s"}, {"sender": 1, "session": "s", "seq": 1},
                   {"sender": "a", "session": "s", "seq": 0}, {"sender": "a", "session": "s", "seq": "1"}):
        raw = msgpack.packb(header)
        envelope = bytes([ENVELOPE_FORMAT]) + len(raw).to_bytes(2, "big") + raw + b"\x00" * 40
        assert reject_reason(Opener(KEY), TOPIC, envelope) == "malformed", header


def test_replayed_envelope_is_rejected_and_later_ones_still_accepted() -> None:
    sealer = Sealer(KEY, "node-a", "s1")
    opener = Opener(KEY)
    first, second, third = (sealer.seal(TOPIC, bytes([i])) for i in range(3))
    opener.open(TOPIC, first)
    opener.open(TOPIC, second)
    assert reject_reason(opener, TOPIC, second) == "replay"
    assert reject_reason(opener, TOPIC, first) == "replay"
    assert opener.open(TOPIC, third).seq == 3


def test_a_rejected_forgery_does_not_advance_replay_state() -> None:
    sealer = Sealer(KEY, "node-a", "s1")
    forger = Sealer(derive_wire_key("cluster-b", NETWORK_VERSION), "node-a", "s1")
    for _ in range(5):
        forger.seal(TOPIC, b"x")
    opener = Opener(KEY)
    assert reject_reason(opener, TOPIC, forger.seal(TOPIC, b"x")) == "auth"  # claims seq 6
    assert opener.open(TOPIC, sealer.seal(TOPIC, b"genuine")).seq == 1


def test_restarted_sender_with_new_session_is_accepted() -> None:
    opener = Opener(KEY)
    before = Sealer(KEY, "node-a", "boot-1")
    for _ in range(5):
        opener.open(TOPIC, before.seal(TOPIC, b"x"))
    after = Sealer(KEY, "node-a", "boot-2")
    opened = opener.open(TOPIC, after.seal(TOPIC, b"back"))
    assert (opened.session, opened.seq, opened.payload) == ("boot-2", 1, b"back")


def test_replay_state_is_a_bounded_lru() -> None:
    opener = Opener(KEY, max_senders=2)
    sealers = [Sealer(KEY, f"node-{i}", "s") for i in range(3)]
    first = [sealer.seal(TOPIC, b"x") for sealer in sealers]
    opener.open(TOPIC, first[0])
    opener.open(TOPIC, first[1])
    opener.open(TOPIC, sealers[0].seal(TOPIC, b"y"))  # node-0 heard again: now most recent
    opener.open(TOPIC, first[2])  # evicts node-1, the least recently heard
    assert opener.tracked_senders == 2
    assert reject_reason(opener, TOPIC, first[0]) == "replay"
    assert reject_reason(opener, TOPIC, first[2]) == "replay"
    # the evicted pair is forgotten: the bound is what makes replay state finite
    assert opener.open(TOPIC, first[1]).sender == "node-1"


def test_sealer_sequence_is_monotonic_across_topics() -> None:
    sealer = Sealer(KEY, "node-a", "s1")
    opener = Opener(KEY)
    seqs = [opener.open(topic, sealer.seal(topic, b"")).seq for topic in (TOPIC, topic_key("x"), TOPIC)]
    assert seqs == [1, 2, 3]


def test_sealer_and_opener_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Sealer(b"short", "node-a", "s1")
    with pytest.raises(ValueError):
        Sealer(KEY, "", "s1")
    with pytest.raises(ValueError):
        Sealer(KEY, "node-a", "s" * 129)
    with pytest.raises(ValueError):
        Opener(KEY, max_senders=0)
