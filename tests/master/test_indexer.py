"""The master's indexer: per-stream dedup and reordering, the producer allowlist, and the
index it hands out. Each case feeds LocalEvents in and checks what the log would receive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skulk.master.indexer import (
    MAX_GAP_WAIT_S,
    MAX_PENDING_PER_ORIGIN,
    MAX_SESSIONS_PER_ORIGIN,
    PRODUCER_EVENT_TYPES,
    SKIPPED_EVENT_TYPES,
    Indexer,
    admit,
    index_own,
    new_indexer,
    release_stale,
    resume_indexer,
)
from skulk.shared.apply import EVENT_TYPES
from skulk.shared.types.events import (
    DownloadOngoing,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    LocalEvent,
    NodeLeft,
    NodeTimedOut,
    TaskAcknowledged,
    TaskCreated,
    TracingStateChanged,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

OK = "ok"      # an allowlisted producer event
SKIP = "skip"  # telemetry that decodes as an event
BAD = "bad"    # a master-only decision


def _event(kind: str, tag: str) -> Event:
    if kind == OK:
        return TaskAcknowledged(event_id=f"e-{tag}", task_id=f"t-{tag}")
    if kind == SKIP:
        return DownloadOngoing(event_id=f"e-{tag}", node_id="n1", model_id="m", attempt_id="a",
                               downloaded_bytes=1, total_bytes=2)
    return InstanceDeleted(event_id=f"e-{tag}", instance_id="i", reason="forged")


def _local(stream: str, seq: int, kind: str = OK) -> LocalEvent:
    origin, session = stream.split("/")
    return LocalEvent(origin=origin, origin_session=session, origin_seq=seq,
                      event=_event(kind, f"{stream}-{seq}"))


def _feed(ix: Indexer, steps: list[tuple], start: datetime = T0) -> tuple[Indexer, list[IndexedEvent]]:
    """steps: (stream, seq[, kind[, seconds after T0]])"""
    out: list[IndexedEvent] = []
    for step in steps:
        stream, seq, kind, at = (*step, OK, 0.0)[:4] if len(step) == 2 else (*step, 0.0)[:4]
        ix, released = admit(ix, _local(stream, seq, kind), start + timedelta(seconds=at))
        out.extend(released)
    return ix, out


def _released(out: list[IndexedEvent]) -> list[tuple[str, int]]:
    return [(f"{e.origin}/{e.origin_session}", e.origin_seq) for e in out]


# (name, steps, released (stream, seq) in index order, counters)
CASES = [
    ("in-order", [("a/s", 0), ("a/s", 1), ("a/s", 2)],
     [("a/s", 0), ("a/s", 1), ("a/s", 2)], {}),
    ("first-seen-sets-expected", [("a/s", 7), ("a/s", 8)],
     [("a/s", 7), ("a/s", 8)], {}),
    ("duplicate-dropped", [("a/s", 0), ("a/s", 1), ("a/s", 1), ("a/s", 0)],
     [("a/s", 0), ("a/s", 1)], {"duplicates": 2}),
    ("below-first-seen-is-duplicate", [("a/s", 5), ("a/s", 4)],
     [("a/s", 5)], {"duplicates": 1}),
    ("gap-held-until-filled", [("a/s", 0), ("a/s", 2), ("a/s", 3), ("a/s", 1)],
     [("a/s", 0), ("a/s", 1), ("a/s", 2), ("a/s", 3)], {}),
    ("held-duplicate-counted-once", [("a/s", 0), ("a/s", 2), ("a/s", 2), ("a/s", 1)],
     [("a/s", 0), ("a/s", 1), ("a/s", 2)], {"duplicates": 1}),
    ("streams-independent", [("a/s", 0), ("b/s", 3), ("a/s", 2), ("b/s", 4), ("a/s", 1)],
     [("a/s", 0), ("b/s", 3), ("b/s", 4), ("a/s", 1), ("a/s", 2)], {}),
    ("new-session-restarts-sequence", [("a/s1", 4), ("a/s2", 0), ("a/s2", 1), ("a/s1", 5)],
     [("a/s1", 4), ("a/s2", 0), ("a/s2", 1), ("a/s1", 5)], {}),
    ("skipped-advances-seq-without-index", [("a/s", 0), ("a/s", 1, SKIP), ("a/s", 2)],
     [("a/s", 0), ("a/s", 2)], {"skipped": 1}),
    ("rejected-advances-seq-without-index", [("a/s", 0), ("a/s", 1, BAD), ("a/s", 2)],
     [("a/s", 0), ("a/s", 2)], {"rejected": 1}),
    ("held-skip-and-reject-released-in-run", [("a/s", 0), ("a/s", 3), ("a/s", 2, BAD), ("a/s", 1, SKIP)],
     [("a/s", 0), ("a/s", 3)], {"skipped": 1, "rejected": 1}),
    ("stale-gap-skipped-on-next-admit", [("a/s", 0), ("a/s", 2, OK, 1.0), ("a/s", 3, OK, 1.0 + MAX_GAP_WAIT_S)],
     [("a/s", 0), ("a/s", 2), ("a/s", 3)], {"gaps_skipped": 1}),
    ("young-gap-still-held", [("a/s", 0), ("a/s", 2, OK, 1.0), ("a/s", 3, OK, MAX_GAP_WAIT_S)],
     [("a/s", 0)], {}),
]


@pytest.mark.parametrize(("name", "steps", "released", "counters"), CASES, ids=[c[0] for c in CASES])
def test_admit(name: str, steps: list[tuple], released: list[tuple[str, int]], counters: dict[str, int]) -> None:
    ix, out = _feed(new_indexer(10), steps)
    assert _released(out) == released
    assert [e.idx for e in out] == list(range(10, 10 + len(out)))  # contiguous, no index burned
    assert ix.next_idx == 10 + len(out)
    for counter in ("duplicates", "skipped", "rejected", "overflow", "gaps_skipped"):
        assert getattr(ix, counter) == counters.get(counter, 0), counter


def test_indexed_event_carries_origin_coordinates_and_receipt_time() -> None:
    local = _local("a/s", 3)
    at = T0 + timedelta(seconds=9)
    _ix, [out] = admit(new_indexer(0), local, at)
    assert out == IndexedEvent(idx=0, origin="a", indexed_at=at, event=local.event,
                               origin_session="s", origin_seq=3)
    assert out.to_wire()["originSession"] == "s" and out.to_wire()["originSeq"] == 3


def test_allowlist_is_exactly_the_producer_facts() -> None:
    names = {t.__name__ for t in PRODUCER_EVENT_TYPES}
    assert names == {
        "NodeJoined", "NodeLeft", "NodeNetworkUpdated", "TopologyEdgeCreated", "TopologyEdgeDeleted",
        "RunnerStatusUpdated", "RunnerDeleted", "TaskAcknowledged", "TaskStatusUpdated", "DownloadPending",
        "DownloadCompleted", "DownloadFailed", "InstancePlacementRefused",
    }
    assert {t.__name__ for t in SKIPPED_EVENT_TYPES} == {"DownloadOngoing"}
    assert set(EVENT_TYPES) >= PRODUCER_EVENT_TYPES | SKIPPED_EVENT_TYPES


@pytest.mark.parametrize(
    "forged",
    [
        InstanceCreated.model_construct(event_id="e"),
        NodeTimedOut(event_id="e", node_id="n2", last_event_age_s=1, effective_age_s=1, timeout_s=30),
        TaskCreated.model_construct(event_id="e"),
        TracingStateChanged(event_id="e", enabled=True),
    ],
    ids=lambda e: type(e).__name__,
)
def test_master_only_decisions_are_rejected_and_counted_by_type(forged: Event) -> None:
    local = LocalEvent.model_construct(origin="a", origin_session="s", origin_seq=0, event=forged)
    ix, out = admit(new_indexer(0), local, T0)
    assert out == []
    assert ix.rejected == 1 and ix.rejected_types == {type(forged).__name__: 1}
    assert ix.next_idx == 0
    ix, out = admit(ix, _local("a/s", 1), T0)  # the stream carries on past the rejected seq
    assert _released(out) == [("a/s", 1)]


def test_every_event_type_is_either_allowed_skipped_or_rejected() -> None:
    rejected = set(EVENT_TYPES) - PRODUCER_EVENT_TYPES - SKIPPED_EVENT_TYPES
    assert {t.__name__ for t in rejected} >= {"InstanceCreated", "InstanceDeleted", "NodeTimedOut",
                                              "TaskCreated", "TaskFailed", "TracingStateChanged"}


def test_pending_is_bounded_per_stream_dropping_the_highest() -> None:
    ix, _ = admit(new_indexer(0), _local("a/s", 0), T0)
    for seq in range(2, MAX_PENDING_PER_ORIGIN + 4):  # one more than fits, then two more
        ix, out = admit(ix, _local("a/s", seq), T0)
        assert out == []
    assert len(ix.pending[("a", "s")]) == MAX_PENDING_PER_ORIGIN
    assert ix.overflow == 2
    assert max(ix.pending[("a", "s")]) == MAX_PENDING_PER_ORIGIN + 1
    ix, out = admit(ix, _local("a/s", 1), T0)
    assert [e.origin_seq for e in out] == list(range(1, MAX_PENDING_PER_ORIGIN + 2))
    assert ix.pending == {} and ix.gap_since == {}
    # the overflowed ones are gone; a later resend of them is indexed in order
    ix, out = admit(ix, _local("a/s", MAX_PENDING_PER_ORIGIN + 2), T0)
    assert _released(out) == [("a/s", MAX_PENDING_PER_ORIGIN + 2)]


def test_other_streams_are_not_blocked_by_a_gap() -> None:
    ix, _ = _feed(new_indexer(0), [("a/s", 0), ("a/s", 5)])
    ix, out = admit(ix, _local("b/s", 0), T0)
    assert _released(out) == [("b/s", 0)]
    assert ix.pending_depth() == 1


@pytest.mark.parametrize(
    ("tick_s", "released"),
    [(MAX_GAP_WAIT_S - 0.5, []), (MAX_GAP_WAIT_S, [("a/s", 3), ("a/s", 4)])],
)
def test_release_stale_skips_a_gap_whose_producer_went_quiet(tick_s: float, released: list) -> None:
    ix, _ = _feed(new_indexer(0), [("a/s", 0), ("a/s", 3), ("a/s", 4), ("b/s", 0), ("b/s", 2)])
    ix, out = release_stale(ix, T0 + timedelta(seconds=tick_s))
    stale_b = [("b/s", 2)] if released else []
    assert _released(out) == released + stale_b
    assert ix.gaps_skipped == (3 if released else 0)  # a/s missed 1, 2; b/s missed 1


def test_gap_clock_restarts_when_the_stream_progresses() -> None:
    # 0, then 2 and 4 held at t=0; 1 fills at t=4 and releases 2; 3 is still missing.
    ix, _ = _feed(new_indexer(0), [("a/s", 0), ("a/s", 2), ("a/s", 4), ("a/s", 1, OK, 4.0)])
    ix, out = release_stale(ix, T0 + timedelta(seconds=MAX_GAP_WAIT_S + 1))
    assert out == []  # the gap at 3 is only 2 s old
    ix, out = release_stale(ix, T0 + timedelta(seconds=4.0 + MAX_GAP_WAIT_S))
    assert _released(out) == [("a/s", 4)]


def test_sessions_per_origin_are_bounded() -> None:
    ix = new_indexer(0)
    for s in range(MAX_SESSIONS_PER_ORIGIN + 2):
        ix, _ = admit(ix, _local(f"a/s{s}", 0), T0)
    ix, _ = admit(ix, _local("b/s0", 0), T0)
    assert [k for k in ix.expected if k[0] == "a"] == [
        ("a", f"s{s}") for s in range(2, MAX_SESSIONS_PER_ORIGIN + 2)
    ]
    assert ("b", "s0") in ix.expected
    assert ix.streams_evicted == 2


def test_index_own_needs_no_allowlist_and_shares_the_counter() -> None:
    ix, first = admit(new_indexer(3), _local("a/s", 0), T0)
    decisions: list[Event] = [
        TaskCreated.model_construct(event_id="x"),
        NodeLeft(event_id="y", node_id="a"),
    ]
    ix, out = index_own(ix, decisions, "master", T0)
    assert [(e.idx, e.origin, e.event) for e in out] == [(4, "master", decisions[0]), (5, "master", decisions[1])]
    assert all(e.origin_session is None and e.origin_seq is None for e in out)
    assert "originSeq" not in out[1].to_wire()
    assert ix.next_idx == 6 and first[0].idx == 3


def test_index_own_of_nothing_changes_nothing() -> None:
    ix = new_indexer(5)
    assert index_own(ix, [], "master", T0) == (ix, [])


def test_resume_rebuilds_dedup_floor_from_history() -> None:
    history = [
        IndexedEvent(idx=0, origin="a", indexed_at=T0, event=_event(OK, "0"), origin_session="s", origin_seq=4),
        IndexedEvent(idx=1, origin="a", indexed_at=T0, event=_event(OK, "1"), origin_session="s", origin_seq=6),
        IndexedEvent(idx=2, origin="m", indexed_at=T0, event=_event(OK, "2")),
    ]
    ix = resume_indexer(3, history)
    ix, out = _feed(ix, [("a/s", 6), ("a/s", 5), ("a/s", 8), ("a/s", 9)])
    # 6 and 5 were indexed by the old master; 7 (say, a skipped DownloadOngoing) left no
    # trace in the log, so 8 starts the stream rather than waiting for it.
    assert _released(out) == [("a/s", 8), ("a/s", 9)]
    assert [e.idx for e in out] == [3, 4]
    assert ix.duplicates == 2


def test_admit_never_mutates_its_input() -> None:
    ix, _ = _feed(new_indexer(0), [("a/s", 0), ("a/s", 2)])
    snapshot = (dict(ix.expected), {k: dict(v) for k, v in ix.pending.items()}, dict(ix.gap_since))
    admit(ix, _local("a/s", 1), T0)
    admit(ix, _local("a/s", 3), T0 + timedelta(seconds=60))
    assert (dict(ix.expected), {k: dict(v) for k, v in ix.pending.items()}, dict(ix.gap_since)) == snapshot


def test_new_indexer_refuses_negative_index() -> None:
    with pytest.raises(ValueError):
        new_indexer(-1)


def test_stats_expose_depth_capacity_and_drops() -> None:
    ix, _ = _feed(new_indexer(0), [("a/s", 0), ("a/s", 2), ("a/s", 0)])
    stats = ix.stats()
    assert stats["pending"] == 1 and stats["pending_capacity_per_stream"] == MAX_PENDING_PER_ORIGIN
    assert stats["duplicates"] == 1 and stats["next_idx"] == 1


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[list[tuple[str, int, str]], dict[str, list[int]]]:
    """Two streams of sequences with random kinds. Each stream's lowest sequence arrives
    first (it sets the expected sequence); everything else, plus a few duplicates, arrives
    in any interleaving."""
    firsts: list[tuple[str, int, str]] = []
    rest: list[tuple[str, int, str]] = []
    sent: dict[str, list[int]] = {}
    for stream in ("a/s", "b/s"):
        start = draw(st.integers(0, 5))
        kinds = draw(st.lists(st.sampled_from([OK, OK, SKIP, BAD]), min_size=1, max_size=12))
        items = [(stream, start + i, k) for i, k in enumerate(kinds)]
        firsts.append(items[0])
        rest += items[1:] + draw(st.lists(st.sampled_from(items), max_size=3))
        sent[stream] = [seq for _, seq, k in items if k == OK]
    return firsts + draw(st.permutations(rest)), sent


@settings(max_examples=150, deadline=None)
@given(_deliveries())
def test_any_lossless_delivery_order_indexes_each_allowed_event_once_in_order(
    case: tuple[list[tuple[str, int, str]], dict[str, list[int]]],
) -> None:
    deliveries, sent = case
    ix, out = _feed(new_indexer(0), list(deliveries))
    assert [e.idx for e in out] == list(range(len(out)))
    for stream, seqs in sent.items():
        assert [seq for s, seq in _released(out) if s == stream] == seqs
    assert ix.pending_depth() == 0
