"""The deafness rule (routing/hearing.py): a table of timelines, pure."""

from __future__ import annotations

import pytest

from skulk.routing.hearing import (
    DEAF_AFTER_S,
    HEARD_AGAIN_GRACE_S,
    ISOLATED_KICK_PERIOD_S,
    KICK_AFTER_DEAF_S,
    KICK_PERIOD_S,
    REFRESH_AFTER_DEAF_S,
    REFRESH_BACKOFF_S,
    Hearing,
    should_kick,
    should_refresh,
)

# A timeline is a list of (time, event): "peers" / "alone" (another node's token present or
# not), "heard" (an authenticated message from another node), "tick".
TIMELINES = [
    ("no peers: never deaf, however quiet", [(0.0, "tick"), (100.0, "tick")], 100.0, 0.0, 0),
    ("peers heard every 2 s: never deaf",
     [(0.0, "peers"), *[(t, "heard") for t in (2.0, 4.0, 6.0, 8.0, 10.0)], (11.0, "tick")], 11.0, 0.0, 0),
    ("one lost heartbeat is not deafness",
     [(0.0, "peers"), (0.5, "heard"), (4.5, "heard"), (5.4, "tick")], 5.4, 0.0, 0),
    ("peers present, silent DEAF_AFTER_S since they appeared: deaf",
     [(0.0, "peers"), (DEAF_AFTER_S, "tick")], DEAF_AFTER_S + 1.0, 1.0, 1),
    ("silent DEAF_AFTER_S since the last message: deaf",
     [(0.0, "peers"), (1.0, "heard"), (1.0 + DEAF_AFTER_S, "tick")], 2.0 + DEAF_AFTER_S, 1.0, 1),
    ("a message long ago does not count before peers appeared",
     [(0.0, "heard"), (10.0, "peers"), (10.0 + DEAF_AFTER_S - 0.5, "tick")], 10.0 + DEAF_AFTER_S - 0.5, 0.0, 0),
    ("hearing again: still deaf during the grace",
     [(0.0, "peers"), (DEAF_AFTER_S, "tick"), (8.0, "heard"), (8.0 + HEARD_AGAIN_GRACE_S - 0.5, "tick")],
     8.0 + HEARD_AGAIN_GRACE_S - 0.5, 8.0 + HEARD_AGAIN_GRACE_S - 0.5 - DEAF_AFTER_S, 1),
    ("hearing again through the grace: hears",
     [(0.0, "peers"), (DEAF_AFTER_S, "tick"), (8.0, "heard"), (9.0, "heard"), (8.0 + HEARD_AGAIN_GRACE_S, "tick")],
     8.0 + HEARD_AGAIN_GRACE_S, 0.0, 1),
    ("heard once, then silent again: stays deaf",
     [(0.0, "peers"), (DEAF_AFTER_S, "tick"), (6.0, "heard"), (6.0 + DEAF_AFTER_S, "tick"),
      (6.0 + DEAF_AFTER_S + HEARD_AGAIN_GRACE_S, "tick")], 20.0, 20.0 - DEAF_AFTER_S, 1),
    ("every peer gone while deaf: alone, not deaf",
     [(0.0, "peers"), (DEAF_AFTER_S, "tick"), (7.0, "alone"), (7.5, "tick")], 8.0, 0.0, 1),
    ("two episodes are counted",
     [(0.0, "peers"), (5.0, "tick"), (6.0, "heard"), (6.0 + HEARD_AGAIN_GRACE_S, "heard"),
      (6.0 + HEARD_AGAIN_GRACE_S, "tick"), (6.0 + HEARD_AGAIN_GRACE_S + DEAF_AFTER_S, "tick")],
     6.5 + HEARD_AGAIN_GRACE_S + DEAF_AFTER_S, 0.5, 2),
]


@pytest.mark.parametrize(("events", "now", "deaf_for", "episodes"),
                         [pytest.param(*row[1:], id=row[0]) for row in TIMELINES])
def test_deafness(events: list[tuple[float, str]], now: float, deaf_for: float, episodes: int) -> None:
    hearing = Hearing()
    for at, event in events:
        if event in ("peers", "alone"):
            hearing.peers(event == "peers", at)
        elif event == "heard":
            hearing.heard(at)
        else:
            hearing.tick(at)
    assert hearing.deaf_for(now) == pytest.approx(deaf_for)
    assert hearing.episodes == episodes


def test_tick_reports_the_moment_deafness_starts_once() -> None:
    hearing = Hearing()
    hearing.peers(True, 0.0)
    assert [hearing.tick(t) for t in (4.5, DEAF_AFTER_S, 6.0, 7.0)] == [False, True, False, False]


@pytest.mark.parametrize(("deaf", "heard_again", "last_refresh", "now", "expected"), [
    pytest.param(False, False, None, 10.0, False, id="hearing: never"),
    pytest.param(True, False, None, 5.0 + REFRESH_AFTER_DEAF_S - 0.5, False, id="deaf just now: not yet"),
    pytest.param(True, False, None, 10.0, True, id="deaf a while, never refreshed: now"),
    pytest.param(True, False, 10.0, 10.0 + REFRESH_BACKOFF_S - 0.5, False, id="deaf, refreshed lately: wait"),
    pytest.param(True, False, 10.0, 10.0 + REFRESH_BACKOFF_S, True, id="deaf past the backoff: again"),
    pytest.param(True, True, None, 10.0, False, id="hearing again (grace): no"),
])
def test_should_refresh(deaf: bool, heard_again: bool, last_refresh: float | None, now: float, expected: bool) -> None:
    hearing = Hearing(deaf_since=5.0 if deaf else None, heard_again_at=8.0 if heard_again else None)
    assert should_refresh(hearing, last_refresh, now) is expected


@pytest.mark.parametrize(("deaf", "heard_again", "last_kick", "now", "expected"), [
    pytest.param(False, False, None, 10.0, False, id="hearing: never"),
    pytest.param(True, False, None, 5.0 + KICK_AFTER_DEAF_S - 0.5, False, id="deaf just now (maybe resumed from a pause): not yet"),
    pytest.param(True, False, None, 5.0 + KICK_AFTER_DEAF_S, True, id="deaf KICK_AFTER_DEAF_S, never kicked: now"),
    pytest.param(True, False, 8.0, 8.0 + KICK_PERIOD_S - 0.5, False, id="kicked within the period: wait"),
    pytest.param(True, False, 8.0, 8.0 + KICK_PERIOD_S, True, id="still deaf a period after the kick: again"),
    pytest.param(True, True, None, 10.0, False, id="hearing again (grace): no"),
    pytest.param(True, True, 7.0, 10.0, False, id="heard since the last kick: no more"),
])
def test_should_kick(deaf: bool, heard_again: bool, last_kick: float | None, now: float, expected: bool) -> None:
    hearing = Hearing(deaf_since=5.0 if deaf else None, heard_again_at=8.0 if heard_again else None)
    assert should_kick(hearing, last_kick, now) is expected


@pytest.mark.parametrize(("deaf", "last_kick", "now", "expected"), [
    pytest.param(False, None, 10.0, True, id="hearing, a challenge unanswered: now (a one-way stall)"),
    pytest.param(False, 9.5, 10.0, False, id="kicked within the period: wait"),
    pytest.param(False, 9.0, 9.0 + KICK_PERIOD_S, True, id="a period after the last kick: again"),
    pytest.param(True, None, 5.5, True, id="deaf just now, a challenge unanswered: now"),
])
def test_should_kick_when_a_challenge_goes_unanswered(deaf: bool, last_kick: float | None, now: float,
                                                       expected: bool) -> None:
    hearing = Hearing(deaf_since=5.0 if deaf else None)
    assert should_kick(hearing, last_kick, now, unanswered=True) is expected


def test_isolation_starts_only_after_a_peer_was_seen_and_ends_with_any_peer() -> None:
    hearing = Hearing()
    hearing.peers(False, 0.0)
    assert hearing.isolated_for(10.0) == 0.0  # a node still starting up is not isolated
    hearing.peers(True, 1.0)
    hearing.peers(False, 5.0)
    hearing.peers(False, 6.0)
    assert hearing.isolated_for(9.0) == 4.0  # counted from the first report without peers
    hearing.peers(True, 9.5)
    assert hearing.isolated_for(20.0) == 0.0


@pytest.mark.parametrize(("expects_peers", "alone_s", "last_kick", "now", "expected"), [
    pytest.param(False, 60.0, None, 100.0, False, id="no bootstrap peers configured: a lone node is normal"),
    pytest.param(True, KICK_AFTER_DEAF_S - 0.5, None, 100.0, False, id="alone just now: not yet"),
    pytest.param(True, KICK_AFTER_DEAF_S, None, 100.0, True, id="alone KICK_AFTER_DEAF_S: now"),
    pytest.param(True, 60.0, 100.0 - ISOLATED_KICK_PERIOD_S + 0.5, 100.0, False, id="kicked lately: wait"),
    pytest.param(True, 60.0, 100.0 - ISOLATED_KICK_PERIOD_S, 100.0, True, id="a period later: again"),
])
def test_should_kick_when_isolated(expects_peers: bool, alone_s: float, last_kick: float | None, now: float,
                                   expected: bool) -> None:
    hearing = Hearing(had_peers=True, alone_since=now - alone_s)
    assert should_kick(hearing, last_kick, now, expects_peers=expects_peers) is expected
