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
ISOLATED_KICK_PERIOD_S: Final = 5.0
"""While isolated (see `Hearing.isolated_for`): at most one kick per this period. Slower than
deafness's: an isolated node is most often one whose peers all went away, and a signal per zenoh
thread every 5 s costs it nothing."""


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
    had_peers: bool = False
    """Some other node's token has been present at least once."""
    alone_since: float | None = None
    """Since when no other node's token has been present, once one has been (None: a peer is
    present, or none ever was)."""

    def peers(self, present: bool, now: float) -> None:
        """Whether any other node's presence token is present (zenoh liveliness), at `now`."""
        if not present:
            if self.had_peers and self.alone_since is None:
                self.alone_since = now
            self.peers_since = None
        else:
            self.had_peers, self.alone_since = True, None
            if self.peers_since is None:
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

    def isolated_for(self, now: float) -> float:
        """Seconds since this node last saw any peer's presence, after having seen one (0.0
        while a peer is present, or before any ever was)."""
        return 0.0 if self.alone_since is None else max(now - self.alone_since, 0.0)

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


def should_kick(hearing: Hearing, last_kick_at: float | None, now: float, *, unanswered: bool = False,
                expects_peers: bool = False) -> bool:
    """Interrupt zenoh's waiting threads now (routing/kick.py says why that ends the stall),
    at most once per KICK_PERIOD_S, when
    - this node is deaf for KICK_AFTER_DEAF_S with nothing heard since, or
    - `unanswered`: a presence challenge of this node's just went unanswered. A stall can be
      one-way: a master resumed from a pause (chaos `sigstop-server`, issue 18) heard a peer
      at once, so it was never deaf, while nothing it sent arrived anywhere (its challenges to
      that peer went unanswered, the third node never saw its presence again) and it led its
      old session alone for minutes. A dead peer misses challenges too; kicking then costs
      one no-op signal per zenoh thread;
    - `expects_peers` (bootstrap peers are configured) and this node has seen no peer's
      presence for KICK_AFTER_DEAF_S after having seen some, at most once per
      ISOLATED_KICK_PERIOD_S. A master resumed from a pause was seen alone: every peer's
      presence gone, and so not deaf by the rule above, nothing it sent arriving anywhere.
      zenoh re-links to bootstrap peers by itself; a kick unsticks it if it sleeps instead."""
    since_kick = None if last_kick_at is None else now - last_kick_at
    if since_kick is not None and since_kick < KICK_PERIOD_S:
        return False
    if unanswered:
        return True
    if expects_peers and hearing.isolated_for(now) >= KICK_AFTER_DEAF_S:
        return since_kick is None or since_kick >= ISOLATED_KICK_PERIOD_S
    if hearing.deaf_since is None or hearing.heard_again_at is not None:
        return False
    return now - hearing.deaf_since >= KICK_AFTER_DEAF_S


__all__ = ["DEAF_AFTER_S", "HEARD_AGAIN_GRACE_S", "ISOLATED_KICK_PERIOD_S", "KICK_AFTER_DEAF_S", "KICK_PERIOD_S",
           "REFRESH_AFTER_DEAF_S", "REFRESH_BACKOFF_S", "Hearing", "should_kick", "should_refresh"]
