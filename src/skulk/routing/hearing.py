"""Is this node deaf? A pure rule over what zenoh says is present and what actually arrives.

Why: zenoh can keep a link up (keep-alives flow, liveliness tokens stay) while nothing of ours
arrives over it. Seen twice (issue 18): during a network cut of a THIRD node, the master's
traffic to a healthy peer stopped for the whole cut while that peer's own messages kept
reaching the master; and a master paused 5 s (SIGSTOP) resumed hearing none of its peers for
minutes while their tokens were present. A node in that state reasons from silence: it drops
its master's presence, campaigns, and with two members may lead a session of its own; a
resumed leader keeps leading its old session alone.

Every live node sends something at least every 2 s (the telemetry heartbeat; the master also
announces every second), so a node that knows live peers (other nodes' liveliness tokens are
present, of sessions it has heard at least once: a node still starting up is not expected to
speak yet) but has received no authenticated message from ANY of them for `DEAF_AFTER_S` is deaf:
the silence says nothing about its peers, only about its own ears. The shell then
- never lets the election decide from that silence (a deaf node keeps campaigning and adopts
  the leader it hears once it hears again),
- makes a deaf leader step down after `skulk.shared.election.DEAF_LEADER_STEP_DOWN_S` (it
  cannot know whether the others elected someone else; if they did not, its peers' campaign
  re-elects it),
- kicks zenoh's own threads out of their waits (routing/kick.py) once deaf for
  `KICK_AFTER_DEAF_S` with nothing heard, then at most every `KICK_PERIOD_S`: the cure for the
  network-cut stall (a missed wake-up; bytes unread in the socket while zenoh sleeps),
- declares its subscriptions and its presence proof queryable again (new declarations make
  every peer recompute its routes towards this node) once deaf for `REFRESH_AFTER_DEAF_S`
  with nothing heard, then at most every `REFRESH_BACKOFF_S`.
Deafness ends `HEARD_AGAIN_GRACE_S` after the first message heard again, so a campaign does
not decide in the instant between the first telemetry heard and the leader's next announcement.

Pure: no zenoh, no clock, no logging. Not thread-safe: the shell locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEAF_AFTER_S: Final = 5.0
"""Two and a half telemetry periods (2 s) of silence from every present peer: one dropped
heartbeat (telemetry is best-effort) is not deafness, and this is below the followers'
LEADER_SILENCE_S (6 s), so a deaf follower is known deaf before it would re-elect."""
HEARD_AGAIN_GRACE_S: Final = 4.0
"""Deafness ends this long after hearing resumes. Past the presence re-proof period (3 s) plus
an answer, so a master whose presence the deaf node dropped (its challenges went unanswered)
is proven again, and its announcements heard, before the election acts on silence again."""
REFRESH_AFTER_DEAF_S: Final = 3.0
"""Deaf this long with nothing heard since: refresh. A node resumed from a pause is deaf at its
first tick (its last message is from before the pause) but hears again once zenoh has
re-linked, within a second or two; it needs no refresh."""
REFRESH_BACKOFF_S: Final = 15.0
"""At most one refresh of this node's declarations per this period while deaf."""
KICK_AFTER_DEAF_S: Final = 2.0
"""Deaf this long with nothing heard since: kick zenoh's threads (routing/kick.py). Past the
second or two a node resumed from a pause needs to hear again on its own."""
KICK_PERIOD_S: Final = 1.0
"""At most one kick per this period while deaf."""


@dataclass(slots=True)
class Hearing:
    """What the rule remembers. The shell reports `peers(...)` and `heard(...)` and calls `tick`."""

    peers_since: float | None = None
    """Since when some other node's token has been present (None: no peer known)."""
    heard_at: float | None = None
    """The latest authenticated message from another node."""
    deaf_since: float | None = None
    """Set while deaf (and through the grace after hearing resumes)."""
    heard_again_at: float | None = None
    """While deaf: the first message heard since (the grace runs from it)."""
    episodes: int = 0
    """How many times this node went deaf (diagnostics)."""

    def peers(self, present: bool, now: float) -> None:
        """Whether any other node's presence token is present (zenoh liveliness), at `now`."""
        if not present:
            self.peers_since = None
        elif self.peers_since is None:
            self.peers_since = now

    def heard(self, now: float) -> None:
        """An authenticated message from another node arrived at `now`."""
        if self.heard_at is None or now > self.heard_at:
            self.heard_at = now
        if self.deaf_since is not None and self.heard_again_at is None:
            self.heard_again_at = now

    def tick(self, now: float) -> bool:
        """Advance to `now`; True when this tick made the node deaf (for the shell to log and act)."""
        silent = self._silent(now)
        if self.deaf_since is None:
            if silent:
                self.deaf_since, self.heard_again_at = now, None
                self.episodes += 1
                return True
            return False
        if self.peers_since is None:
            self.deaf_since = self.heard_again_at = None  # nobody left to hear: alone, not deaf
        elif silent:
            self.heard_again_at = None  # heard once, then nothing again: still deaf
        elif self.heard_again_at is not None and now - self.heard_again_at >= HEARD_AGAIN_GRACE_S:
            self.deaf_since = self.heard_again_at = None
        return False

    def deaf_for(self, now: float) -> float:
        """Seconds this node has been deaf (0.0 when it hears)."""
        return 0.0 if self.deaf_since is None else max(now - self.deaf_since, 0.0)

    def _silent(self, now: float) -> bool:
        if self.peers_since is None:
            return False
        last = self.peers_since if self.heard_at is None else max(self.heard_at, self.peers_since)
        return now - last >= DEAF_AFTER_S


def should_refresh(hearing: Hearing, last_refresh_at: float | None, now: float) -> bool:
    """Deaf for REFRESH_AFTER_DEAF_S with nothing heard since, and no refresh within
    REFRESH_BACKOFF_S: refresh now."""
    if hearing.deaf_since is None or hearing.heard_again_at is not None:
        return False
    if now - hearing.deaf_since < REFRESH_AFTER_DEAF_S:
        return False
    return last_refresh_at is None or now - last_refresh_at >= REFRESH_BACKOFF_S


def should_kick(hearing: Hearing, last_kick_at: float | None, now: float) -> bool:
    """Deaf for KICK_AFTER_DEAF_S with nothing heard since, and no kick within KICK_PERIOD_S:
    interrupt zenoh's waiting threads now (routing/kick.py says why that ends the stall)."""
    if hearing.deaf_since is None or hearing.heard_again_at is not None:
        return False
    if now - hearing.deaf_since < KICK_AFTER_DEAF_S:
        return False
    return last_kick_at is None or now - last_kick_at >= KICK_PERIOD_S


__all__ = ["DEAF_AFTER_S", "HEARD_AGAIN_GRACE_S", "KICK_AFTER_DEAF_S", "KICK_PERIOD_S", "REFRESH_AFTER_DEAF_S",
           "REFRESH_BACKOFF_S", "Hearing", "should_kick", "should_refresh"]
