"""Follower ordering (FollowerBuffer) and master replay pacing (ReplayScheduler), as plain
functions over hand-built data: no event loop, no clock."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from skulk.shared.sync import (
    GAP_REQUEST_RETRY_S,
    MAX_BUFFERED_EVENTS,
    MAX_REPLAY_NODES,
    REPLAY_BURST_EVENTS,
    REPLAY_BURST_INTERVAL_S,
    TAIL_LAG_S,
    FollowerBuffer,
    ReplayScheduler,
    drain,
    due_bursts,
    follower_buffer,
    follower_needs_ticks,
    next_due_at,
    on_master_high_water,
    on_tick,
    receive,
    replay_scheduler,
    request,
    reset,
)
from skulk.shared.types.events import IndexedEvent, NodeLeft

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def ev(idx: int) -> IndexedEvent:
    return IndexedEvent(idx=idx, origin="m", indexed_at=T0, event=NodeLeft(event_id=f"e{idx}", node_id="n"))


def feed(buf: FollowerBuffer, idxs: list[int], now: float = 0.0) -> tuple[FollowerBuffer, list[int], list[int]]:
    """Receive events by index at one instant; return buffer, applied idxs, requested sinces."""
    applied: list[int] = []
    requests: list[int] = []
    for i in idxs:
        buf, ready, since = receive(buf, ev(i), now)
        applied += [e.idx for e in ready]
        if since is not None:
            requests.append(since)
    return buf, applied, requests


# -- follower ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrivals", "applied", "requests", "next_idx", "pending"),
    [
        pytest.param([10, 11, 12], [10, 11, 12], [], 13, [], id="in order"),
        pytest.param([10, 10, 11, 9, 11], [10, 11], [], 12, [], id="duplicates and old ignored"),
        pytest.param([12, 13], [], [10], 10, [12, 13], id="gap asks from next_idx once"),
        pytest.param([12, 11, 10], [10, 11, 12], [10], 13, [], id="gap then fill releases in order"),
        pytest.param([12, 10, 14], [10], [10], 11, [12, 14], id="partial fill keeps the rest"),
        pytest.param([13, 13, 12], [], [10], 10, [12, 13], id="pending duplicate ignored"),
        pytest.param([11, 12, 10, 13], [10, 11, 12, 13], [10], 14, [], id="fill then live continues"),
    ],
)
def test_receive(arrivals: list[int], applied: list[int], requests: list[int], next_idx: int, pending: list[int]) -> None:
    buf, got, asked = feed(follower_buffer(10), arrivals)
    assert (got, asked, buf.next_idx, sorted(buf.pending)) == (applied, requests, next_idx, pending)


def test_gap_requests_are_coalesced_and_retried() -> None:
    buf, _, asked = feed(follower_buffer(0), [5], now=0.0)
    assert asked == [0] and buf.requested_since == 0
    # more gap events within the retry period: no new request
    buf, _, asked = feed(buf, [6, 7], now=1.0)
    assert asked == []
    assert on_tick(buf, GAP_REQUEST_RETRY_S - 0.25)[1] is None
    # still open after the retry period: ask again, then wait another period
    buf, since = on_tick(buf, GAP_REQUEST_RETRY_S)
    assert since == 0 and buf.requested_at == GAP_REQUEST_RETRY_S
    assert on_tick(buf, GAP_REQUEST_RETRY_S + 1.0)[1] is None
    # a partial fill moves the retry's since_idx
    buf, applied, _ = feed(buf, [0, 1, 2], now=2.5)
    assert applied == [0, 1, 2]
    assert on_tick(buf, 2 * GAP_REQUEST_RETRY_S)[1] == 3


def test_closed_gap_stops_retries_and_a_new_gap_respects_the_rate_limit() -> None:
    buf, _, _ = feed(follower_buffer(0), [2], now=0.0)
    buf, applied, _ = feed(buf, [0, 1], now=0.5)
    assert applied == [0, 1, 2] and not buf.gap_open and buf.requested_since is None
    assert on_tick(buf, 10.0)[1] is None
    buf, _, asked = feed(buf, [5], now=1.0)  # new gap, but we asked at t=0
    assert asked == []
    assert on_tick(buf, GAP_REQUEST_RETRY_S)[1] == 3


def test_buffer_is_bounded_by_dropping_the_highest() -> None:
    buf = follower_buffer(0)
    top = MAX_BUFFERED_EVENTS + 10
    for i in range(top, 0, -1):  # worst case: newest first, event 0 missing
        buf, ready, _ = receive(buf, ev(i), 0.0)
        assert ready == []
    assert len(buf.pending) == MAX_BUFFERED_EVENTS
    assert min(buf.pending) == 1 and max(buf.pending) == MAX_BUFFERED_EVENTS
    buf, _, _ = feed(buf, [MAX_BUFFERED_EVENTS + 100])  # beyond the bound and highest: dropped
    assert buf.dropped == 11 and len(buf.pending) == MAX_BUFFERED_EVENTS
    buf, applied, _ = feed(buf, [0])
    assert applied == list(range(MAX_BUFFERED_EVENTS + 1)) and not buf.pending
    # the dropped ones come again through replay
    buf, applied, _ = feed(buf, list(range(MAX_BUFFERED_EVENTS + 1, top + 1)))
    assert applied[-1] == top


def test_receive_never_mutates_its_input() -> None:
    buf, _, _ = feed(follower_buffer(0), [3, 4])
    snapshot = dict(buf.pending)
    receive(buf, ev(0), 0.0)
    receive(buf, ev(5), 0.0)
    assert dict(buf.pending) == snapshot and buf.next_idx == 0


@pytest.mark.parametrize(
    ("held", "new_next", "pending_after", "drained", "next_after"),
    [
        pytest.param([5, 6, 9], 8, [9], [], 8, id="drops what the snapshot covers"),
        pytest.param([5, 6, 9], 6, [6, 9], [6], 7, id="run at next_idx released by drain"),
        pytest.param([12, 13], 12, [12, 13], [12, 13], 14, id="snapshot closes the gap"),
        pytest.param([5], 20, [], [], 20, id="all covered"),
    ],
)
def test_reset_keeps_later_events(held: list[int], new_next: int, pending_after: list[int], drained: list[int],
                                  next_after: int) -> None:
    buf, _, _ = feed(follower_buffer(2), held)
    buf = reset(buf, new_next)
    assert buf.next_idx == new_next and sorted(buf.pending) == pending_after
    buf, ready = drain(buf)
    assert [e.idx for e in ready] == drained and buf.next_idx == next_after


def test_reset_then_live_events_continue() -> None:
    buf, _, _ = feed(follower_buffer(0), [50, 51])
    buf = reset(buf, 50)
    buf, applied, _ = feed(buf, [52])  # receive also releases a run held at next_idx
    assert applied == [50, 51, 52]


# -- replay scheduler ----------------------------------------------------------------------


def drive(sched: ReplayScheduler, until: float, last_idx: int, start: float = 0.0) -> tuple[ReplayScheduler, list]:
    """Call due_bursts every 50 ms from `start` to `until`; return (time, burst) pairs."""
    sent = []
    steps = round((until - start) / 0.05)
    for k in range(steps + 1):
        now = start + k * 0.05
        sched, bursts = due_bursts(sched, now, last_idx)
        sent += [(round(now, 2), b) for b in bursts]
    return sched, sent


def test_replay_is_paced_in_bursts() -> None:
    sched = request(replay_scheduler(), "n1", 100)
    sched, sent = drive(sched, 2.0, last_idx=199)
    assert sent == [
        (0.0, ("n1", 100, 132)),
        (0.25, ("n1", 132, 164)),
        (0.5, ("n1", 164, 196)),
        (0.75, ("n1", 196, 200)),
    ]
    assert all(end - start <= REPLAY_BURST_EVENTS for _, (_, start, end) in sent)
    assert sched.open_requests == 0 and next_due_at(sched, 2.0) is None


def test_request_completes_at_the_available_edge() -> None:
    sched, bursts = due_bursts(request(replay_scheduler(), "n1", 10), 0.0, 9)
    assert bursts == [] and sched.open_requests == 0  # nothing newer than what it has
    sched, bursts = due_bursts(request(replay_scheduler(), "n1", 10), 0.0, -1)
    assert bursts == [] and sched.open_requests == 0  # empty log


@pytest.mark.parametrize(
    ("requests", "expected_start"),
    [
        pytest.param([("n1", 40), ("n1", 60)], 40, id="keeps the lower start"),
        pytest.param([("n1", 60), ("n1", 40)], 40, id="rewinds to an earlier re-ask"),
        pytest.param([("n1", 40), ("n1", 40), ("n1", 40)], 40, id="repeats are one request"),
    ],
)
def test_requests_coalesce(requests: list[tuple[str, int]], expected_start: int) -> None:
    sched = replay_scheduler()
    for node, since in requests:
        sched = request(sched, node, since)
    assert dict(sched.wanted) == {"n1": expected_start}


def test_re_request_mid_replay_rewinds_but_keeps_pacing() -> None:
    sched = request(replay_scheduler(), "n1", 0)
    sched, first = due_bursts(sched, 0.0, 999)
    assert first == [("n1", 0, 32)]
    sched = request(sched, "n1", 10)  # follower lost part of the burst
    sched, none = due_bursts(sched, 0.1, 999)
    assert none == []  # still paced
    sched, again = due_bursts(sched, REPLAY_BURST_INTERVAL_S, 999)
    assert again == [("n1", 10, 42)]


def test_a_completed_node_asking_again_is_still_paced() -> None:
    sched, sent = due_bursts(request(replay_scheduler(), "n1", 0), 0.0, 9)
    assert sent == [("n1", 0, 10)] and sched.open_requests == 0
    sched, sent = due_bursts(request(sched, "n1", 10), 0.1, 20)
    assert sent == []
    assert next_due_at(sched, 0.1) == REPLAY_BURST_INTERVAL_S
    sched, sent = due_bursts(sched, REPLAY_BURST_INTERVAL_S, 20)
    assert sent == [("n1", 10, 21)]


def test_multiple_nodes_are_interleaved_each_at_its_own_pace() -> None:
    sched = request(replay_scheduler(), "n1", 0)
    sched, sent = drive(sched, 0.1, last_idx=99)
    sched = request(sched, "n2", 50)
    sched, more = drive(sched, 1.5, last_idx=99, start=0.15)
    sent += more
    assert sent == [
        (0.0, ("n1", 0, 32)),
        (0.15, ("n2", 50, 82)),
        (0.25, ("n1", 32, 64)),
        (0.4, ("n2", 82, 100)),
        (0.5, ("n1", 64, 96)),
        (0.75, ("n1", 96, 100)),
    ]
    per_node: dict[str, list[float]] = {}
    for t, (node, _, _) in sent:
        per_node.setdefault(node, []).append(t)
    for times in per_node.values():
        assert all(b - a >= REPLAY_BURST_INTERVAL_S - 1e-9 for a, b in itertools.pairwise(times))


def test_tracked_nodes_are_bounded_oldest_dropped() -> None:
    sched = replay_scheduler()
    for i in range(MAX_REPLAY_NODES + 3):
        sched = request(sched, f"n{i}", 0)
    assert sched.open_requests == MAX_REPLAY_NODES and sched.dropped_requests == 3
    assert "n0" not in sched.wanted and f"n{MAX_REPLAY_NODES + 2}" in sched.wanted
    sched, bursts = due_bursts(sched, 0.0, 1000)
    assert len(bursts) == MAX_REPLAY_NODES
    # pacing memory of completed nodes does not grow without bound either
    sched, _ = due_bursts(replay_scheduler(), 0.0, 0)
    for i in range(MAX_REPLAY_NODES):
        sched, _ = due_bursts(request(sched, f"m{i}", 0), float(i), 0)
    assert len(sched.last_burst_at) <= 1


def test_follower_and_scheduler_together_recover_a_gap() -> None:
    """A follower that missed 100 events while live ones kept coming ends up applying all of
    them in order, fed by paced bursts."""
    log = [ev(i) for i in range(200)]
    buf = follower_buffer(0)
    applied: list[int] = []
    sched = replay_scheduler()
    now = 0.0
    for e in log[100:120]:  # live events arrive; 0..99 were missed
        buf, ready, since = receive(buf, e, now)
        applied += [r.idx for r in ready]
        if since is not None:
            sched = request(sched, "f", since)
    while now < 5.0 and len(applied) < 120:
        now += 0.05
        sched, bursts = due_bursts(sched, now, 119)
        for _, start, end in bursts:
            for e in log[start:end]:
                buf, ready, _ = receive(buf, e, now)
                applied += [r.idx for r in ready]
    assert applied == list(range(120))
    assert now < 1.5  # four bursts at 250 ms


@pytest.mark.parametrize(("name", "master_known", "i_am_master", "synced", "gap", "expected"), [
    ("no master yet: nothing to ask anyone", False, False, False, False, False),
    ("the master itself never catches up", True, True, True, False, False),
    ("the master, even with a stale gap", True, True, True, True, False),
    ("a follower waiting for its snapshot", True, False, False, False, True),
    ("a follower in step", True, False, True, False, False),
    ("a follower holding events beyond a gap", True, False, True, True, True),
    ("a follower trailing the master's announcement", True, False, True, "behind", True),
])
def test_follower_needs_ticks(name, master_known, i_am_master, synced, gap, expected) -> None:
    buf = follower_buffer(5)
    if gap == "behind":
        buf, _since = on_master_high_water(buf, 9, 0.0)
    elif gap:
        buf, ready, _since = receive(buf, ev(7), 0.0)
        assert buf.gap_open and not ready
    assert follower_needs_ticks(master_known, i_am_master, synced, buf) is expected, name


@pytest.mark.parametrize(("name", "steps", "asks"), [
    # steps: (announced high water, now); asks: the since_idx each step returns
    ("in step: the announcement is at or below what we hold", [(4, 0.0), (3, 5.0)], [None, None]),
    ("a missed tail is asked for once it has lasted TAIL_LAG_S",
     [(7, 0.0), (7, TAIL_LAG_S - 0.1), (7, TAIL_LAG_S)], [None, None, 5]),
    ("asked again only after GAP_REQUEST_RETRY_S",
     [(7, 0.0), (7, TAIL_LAG_S), (7, TAIL_LAG_S + 1.0), (7, TAIL_LAG_S + GAP_REQUEST_RETRY_S)], [None, 5, None, 5]),
    ("caught up meanwhile: the lag starts over",
     [(7, 0.0), (4, 1.0), (7, 1.2), (7, 1.2 + TAIL_LAG_S)], [None, None, None, 5]),
])
def test_on_master_high_water(name, steps, asks) -> None:
    buf = follower_buffer(5)
    got = []
    for high_water, now in steps:
        buf, since = on_master_high_water(buf, high_water, now)
        got.append(since)
    assert got == asks, name


def test_a_gap_takes_precedence_over_the_announcement() -> None:
    buf, _ready, _since = receive(follower_buffer(5), ev(7), 0.0)
    assert on_master_high_water(buf, 9, 10.0) == (buf, None)  # the gap's own requests cover it
