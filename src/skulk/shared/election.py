"""The master election as a pure state machine: `step(view, input, me, now) -> (view, outputs)`.

One master at a time. Nodes campaign at an election *clock*; every candidate seen at the
campaign's clock is recorded, and when the campaign window closes each node picks the best
recorded candidate by `(clock, seniority, commands_seen, node_id)` (higher wins). The session
id is derived from the winner and the clock (`session_id_for`), so every node that saw the
same candidates agrees on the outcome without another round trip. The winner announces a
"leader" message; conflicting leaders (split brain, a lost candidate) are settled by the
same ranking: the lower leader steps down and follows the higher one.

Rules that shape it:
- A leader is adopted at once by a node that is discovering, campaigning at a clock no
  higher than the leader's, or following a master that ranks no higher. Joins therefore
  never cause master churn: a newcomer hears an announcement within LEADER_ANNOUNCE_S,
  before its DISCOVERY_S runs out, and presence changes alone start nothing while the
  master is live.
- A candidate with a higher clock than ours means the cluster may be re-electing: a node
  that is discovering, campaigning, or following a master it has not heard for
  LEADER_SILENCE_S joins that campaign. A leader never does, nor does a node whose master
  is live: a healthy master is never deposed by a node returning from a partition or a
  pause with a higher clock. The leader answers every candidate by re-announcing, and a
  campaigning node adopts any leader it hears, so the returning node rejoins the current
  session and no stream anywhere fails.
- A campaign decides only when a majority of the cluster's members campaign in it
  (`skulk.shared.election_quorum`): a node cut off by the network keeps campaigning instead
  of leading a session of its own, whose higher clock would depose the healthy master when
  the link heals.
- A deaf node (it hears none of its present peers, `Me.deaf_for_s`) starts no campaign (its
  master's silence or lost presence is its own deafness) and never ends one: it keeps
  following, or campaigning, and adopts the leader it hears once it hears again. A leader
  deaf for DEAF_LEADER_STEP_DOWN_S steps down and campaigns: a leader resumed from a pause
  that cannot hear the majority's newer session must not keep leading its old one alone.
- A leader whose own ticks stalled for STALL_HOLD_AFTER_S (the process was stopped or
  starved: SIGSTOP, a laptop lid, a swap storm) indexes nothing for STALL_HOLD_S after it
  (`stall_hold_until`; the shell's master waits): its peers dropped its presence after the
  transport lease and have most likely elected someone else meanwhile, whose announcement,
  once heard, makes it step down as any lower leader does. Indexing on, it would write
  events into its stale session and then adopt the newer session's lower index: indices
  reused (the chaos suite's `sigstop-server`, issue 18). Holding rather than stepping down
  costs a stall the peers did not act on (a blocked event loop) a few seconds of waiting,
  not a failover of every stream.
- A winner that never takes office is passed over: a node that followed the winner of its
  campaign and heard no announcement from it for LEADER_SILENCE_S re-elects without it for
  WINNER_PASS_OVER_S (`passed_over`). Its candidacy still counts towards the majority; it
  just cannot win. Seen in the chaos suite (issue 18): a node resumed from a pause, deaf
  but still heard, joined each new campaign with the best rank, was elected every 7.5 s and
  never led (a deaf node decides nothing), failing every stream in the cluster each time.
  Once it speaks as a leader it is adopted as any leader is.
- A node freezes its own seniority and commands_seen when a campaign starts and announces
  exactly those values while it leads, so every receiver ranks it the same way at all times
  (otherwise two leaders comparing moving counters could both step down, or both stay).

The shell owns the clock, the sockets and presence. It ticks `step(view, Tick(), ...)`
when `next_tick_in_s` says the next timed rule may be due (at most MAX_TICK_GAP_S apart,
and again after any other input changes the view), feeds every election message from a peer as `Received`, every presence
change as `PresenceChanged`, publishes each `Broadcast`, and acts on `Elected`. While the
machine is campaigning, `view.master_id` still names the last master: the shell should
treat `view.phase == "leading"` (see `is_leading`) as the only authority to index events.

This module is pure: no asyncio, no sockets, no clock reads, no logging, no randomness.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from skulk.shared.election_quorum import has_quorum
from skulk.shared.types.election import ElectionMessage, Rank
from skulk.shared.types.ids import NodeId, SessionId

# -- timing (seconds; the shell ticks when `next_tick_in_s` says a rule may be due) ---------

DISCOVERY_S: Final = 2.0
"""How long a starting node listens for an existing leader before campaigning. Must exceed
LEADER_ANNOUNCE_S, so a node joining a healthy cluster always adopts its leader instead of
starting a campaign."""

CAMPAIGN_WINDOW_S: Final = 1.5
"""How long a campaign collects candidates before deciding. Three candidate rebroadcasts fit
in it, so one lost candidate message does not hide a node from the count."""

CANDIDATE_REBROADCAST_S: Final = 0.5
"""Period of a campaigning node's candidate rebroadcast (covers loss and late joiners)."""

LEADER_ANNOUNCE_S: Final = 1.0
"""Period of the leader's announcement: the heartbeat followers watch."""

LEADER_SILENCE_S: Final = 6.0
"""A follower that hears no announcement from its master for this long re-elects. Six
announce periods: a few lost announcements or a busy event loop must not depose a master."""

# -- bounds --------------------------------------------------------------------------------

DEAF_LEADER_STEP_DOWN_S: Final = 10.0
"""A leader that has heard none of its present peers for this long steps down and campaigns
(see `Me.deaf_for_s`). Well past the 2 s heartbeat, so a moment of silence from busy
followers never deposes a healthy master; short next to the minutes a leader resumed from a
pause was seen to stay deaf while the others had elected a newer session."""

WINNER_PASS_OVER_S: Final = 60.0
"""How long a campaign winner that never announced is passed over by the nodes that chose
it. Long enough for the rest to elect and settle on another master; a pass-over only
decides who wins a campaign, never whether to adopt a leader that speaks."""

STALL_HOLD_AFTER_S: Final = 2.0
"""A leader whose ticks (every ~0.25 s) stalled this long holds its indexing. Past the 1 s
transport lease after which its peers drop its presence and campaign."""

STALL_HOLD_S: Final = 8.0
"""How long a leader back from such a stall indexes nothing. Long enough to re-link and hear
a newer leader's announcement (every LEADER_ANNOUNCE_S; 6 s after a 5 s pause was the longest
seen); requests meanwhile wait (their commands are re-sent), none fails."""

MAX_PASSED_OVER: Final = 64
"""Winners remembered as passed over (the earliest to expire forgotten first)."""

MAX_CANDIDATES: Final = 256
"""Candidates recorded per campaign. Beyond it the lowest-ranked are forgotten, which can
never change the winner."""

MAX_DEPARTED_TRACKED: Final = 256
"""Nodes remembered as having left presence (oldest forgotten first): their late election
messages are ignored and their candidacies do not count."""

MAX_SESSION_ID_CHARS: Final = 128
_SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")

Phase = Literal["discovering", "campaigning", "following", "leading"]


# -- data ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Me:
    """This node as the election ranks it; the shell passes the current values every step."""

    node_id: str
    seniority: int  # elections this node has won in its lifetime
    commands_seen: int  # commands this node has observed
    members: frozenset[str] = frozenset()
    """The cluster's members per this node's replicated State (`State.nodes`): a campaign
    decides only when a majority of them campaign (`skulk.shared.election_quorum`)."""
    deaf_for_s: float = 0.0
    """How long this node has heard nothing from any peer whose presence token is present
    (`skulk.routing.hearing`; 0.0 when it hears). Silence heard by a deaf node says nothing
    about its peers: a deaf node never ends a campaign, and a deaf leader steps down after
    DEAF_LEADER_STEP_DOWN_S."""


@dataclass(frozen=True)
class ElectionView:
    """Everything the election remembers. Build the first one with `initial_view`."""

    phase: Phase
    clock: int
    master_id: str | None
    session_id: str | None
    started_at: float
    # campaigning: when the window closes, and every candidate recorded at `clock` (mine too)
    campaign_deadline: float | None = None
    candidates: Mapping[str, ElectionMessage] = field(default_factory=dict[str, ElectionMessage])
    # my frozen candidacy for the current campaign, and the leadership it won
    my_claim: ElectionMessage | None = None
    # following: what the current master ranks as (its candidacy or its announcement)
    master_claim: ElectionMessage | None = None
    last_leader_heard_at: float | None = None
    last_broadcast_at: float | None = None
    live_peers: frozenset[str] = frozenset()
    departed: tuple[str, ...] = ()  # left presence and not back, oldest first
    passed_over: Mapping[str, float] = field(default_factory=dict[str, float])
    """Campaign winners that never announced, and until when they cannot win here."""


@dataclass(frozen=True)
class Tick:
    """Time passed; the shell sends one when `next_tick_in_s` runs out."""


@dataclass(frozen=True)
class Received:
    """An election message from the network (the machine ignores its own echoes)."""

    message: ElectionMessage


@dataclass(frozen=True)
class PresenceChanged:
    """The full set of live peers (never this node) after a presence change."""

    live_peers: frozenset[str]


Input = Tick | Received | PresenceChanged


@dataclass(frozen=True)
class Broadcast:
    """Publish this message on the election topic."""

    message: ElectionMessage


@dataclass(frozen=True)
class Elected:
    """A new (master, session): emitted once per change, never repeated for one session."""

    master_id: str
    session_id: str
    clock: int
    i_am_master: bool


Output = Broadcast | Elected
Step = tuple[ElectionView, list[Output]]


# -- public helpers ------------------------------------------------------------------------


def initial_view(now: float) -> ElectionView:
    """A node that has just started: discovering, knowing no master, at clock 0."""
    return ElectionView(phase="discovering", clock=0, master_id=None, session_id=None, started_at=now)


def rank(message: ElectionMessage) -> Rank:
    """The election order: (clock, seniority, commands_seen, node_id), higher wins."""
    return message.rank


def session_id_for(master_id: str, clock: int) -> str:
    """The session id every node derives for `master_id` winning at `clock`.

    `<master>.<clock>` when that is a valid id; a node id too long for that (or with
    characters outside [A-Za-z0-9_.-]) is replaced by a digest, still deterministic.
    """
    plain = f"{master_id}.{clock}"
    if len(plain) <= MAX_SESSION_ID_CHARS and _SESSION_ID_RE.fullmatch(plain):
        return plain
    return f"{hashlib.sha256(master_id.encode()).hexdigest()[:32]}.{clock}"


def stall_hold_until(view: ElectionView, stalled_s: float, me: Me, now: float) -> float | None:
    """Until when a leader back from a stall of `stalled_s` (measured by the shell: how late
    its tick came) indexes nothing; None: no hold. Only a leader with other members holds: a
    lone node has nobody who could have elected another master."""
    if view.phase != "leading" or stalled_s < STALL_HOLD_AFTER_S or not (me.members - {me.node_id}):
        return None
    return now + STALL_HOLD_S


def is_leading(view: ElectionView) -> bool:
    """True while this node is the master: the shell's only authority to index events."""
    return view.phase == "leading"


def step(view: ElectionView, inp: Input, me: Me, now: float) -> Step:
    """Advance the election by one input. Pure: same arguments, same result."""
    handler = _HANDLERS.get(type(inp))
    if handler is None:
        raise TypeError(f"not an election input: {inp!r}")
    return handler(view, inp, me, now)


# -- handlers: each an ordered chain of rules; the first that applies wins ----------------


def _on_tick(view: ElectionView, _inp: Tick, me: Me, now: float) -> Step:
    return (
        end_discovery(view, me, now)
        or close_campaign(view, me, now)
        or rebroadcast_candidate(view, now)
        or notice_leader_silence(view, me, now)
        or step_down_when_deaf(view, me, now)
        or announce_leadership(view, now)
        or (view, [])
    )


def _on_received(view: ElectionView, inp: Received, me: Me, now: float) -> Step:
    msg = inp.message
    return (
        ignore_own_or_departed(view, msg, me)
        or adopt_leader(view, msg, now)
        or settle_leader_conflict(view, msg, now)
        or join_higher_campaign(view, msg, me, now)
        or record_candidate(view, msg)
        or support_chosen_candidate(view, msg)
        or answer_candidate(view, msg, now)
        or (view, [])
    )


def _on_presence(view: ElectionView, inp: PresenceChanged, me: Me, now: float) -> Step:
    view = _track_presence(view, frozenset(inp.live_peers) - {me.node_id})
    return campaign_when_master_left(view, me, now) or (view, [])


_HANDLERS: Final[Mapping[type, Callable[..., Step]]] = {
    Tick: _on_tick,
    Received: _on_received,
    PresenceChanged: _on_presence,
}


# -- tick rules ----------------------------------------------------------------------------


def end_discovery(view: ElectionView, me: Me, now: float) -> Step | None:
    """No leader spoke during discovery: campaign at the next clock."""
    if view.phase != "discovering" or now - view.started_at < DISCOVERY_S:
        return None
    return _start_campaign(view, view.clock + 1, me, now)


def close_campaign(view: ElectionView, me: Me, now: float) -> Step | None:
    """The window is over: the best recorded candidate still present wins, provided a
    majority of the cluster's members campaign (`has_quorum`). A minority (a node cut off
    by the network) opens another window instead and keeps campaigning at the same clock:
    it adopts the current leader as soon as it hears it (`adopt_leader`), so healing the
    cut changes no master."""
    if view.phase != "campaigning" or view.campaign_deadline is None or now < view.campaign_deadline:
        return None
    assert view.my_claim is not None
    if me.deaf_for_s > 0:
        # Deaf: the candidacies it lacks may just be unheard; decide nothing, keep listening.
        return dataclasses.replace(view, campaign_deadline=now + CAMPAIGN_WINDOW_S), []
    eligible = [c for c in view.candidates.values() if c.node_id not in view.departed]
    if not has_quorum(me.members, [c.node_id for c in eligible], me.node_id):
        return dataclasses.replace(view, campaign_deadline=now + CAMPAIGN_WINDOW_S), []
    winnable = [c for c in eligible if view.passed_over.get(c.node_id, now) <= now]
    winner = max([view.my_claim, *winnable], key=rank)
    if winner.node_id == me.node_id:
        return _lead(view, now)
    followed, outputs = _follow(view, winner, now)
    # Keep my candidacy: the winner may still be campaigning without my vote
    # (`support_chosen_candidate`).
    return dataclasses.replace(followed, my_claim=view.my_claim), outputs


def rebroadcast_candidate(view: ElectionView, now: float) -> Step | None:
    """Campaigning: repeat my candidacy, for lost messages and late joiners."""
    if view.phase != "campaigning" or not _due(view.last_broadcast_at, now, CANDIDATE_REBROADCAST_S):
        return None
    assert view.my_claim is not None
    return dataclasses.replace(view, last_broadcast_at=now), [Broadcast(view.my_claim)]


def notice_leader_silence(view: ElectionView, me: Me, now: float) -> Step | None:
    """Following a master that has not announced for LEADER_SILENCE_S: re-elect. Not while
    deaf: the silence is this node's, and its candidacy would let a node that just healed
    from a cut decide a new session with it (seen on a network cut, issue 18)."""
    if view.phase != "following" or me.deaf_for_s > 0 or not _due(view.last_leader_heard_at, now, LEADER_SILENCE_S):
        return None
    if view.master_claim is not None and view.master_claim.kind == "candidate" and view.master_id is not None:
        # The winner we chose never took office: elect without it for a while.
        view = dataclasses.replace(view, passed_over=_pass_over(view.passed_over, view.master_id, now))
    return _start_campaign(view, view.clock + 1, me, now)


def step_down_when_deaf(view: ElectionView, me: Me, now: float) -> Step | None:
    """Leading while deaf for DEAF_LEADER_STEP_DOWN_S: campaign at the next clock. Once it
    hears again it adopts whichever leader speaks (a newer session the others elected
    meanwhile), or, if none does, its peers join the campaign and re-elect."""
    if view.phase != "leading" or me.deaf_for_s < DEAF_LEADER_STEP_DOWN_S:
        return None
    return _start_campaign(view, view.clock + 1, me, now)


def announce_leadership(view: ElectionView, now: float) -> Step | None:
    """Leading: the periodic announcement followers use as the master's heartbeat."""
    if view.phase != "leading" or not _due(view.last_broadcast_at, now, LEADER_ANNOUNCE_S):
        return None
    return _announce(view, now)


# -- message rules -------------------------------------------------------------------------


def ignore_own_or_departed(view: ElectionView, msg: ElectionMessage, me: Me) -> Step | None:
    """My own echo, or a late message from a node presence says has left: nothing to do."""
    if msg.node_id == me.node_id or msg.node_id in view.departed:
        return view, []
    return None


def adopt_leader(view: ElectionView, msg: ElectionMessage, now: float) -> Step | None:
    """A leader message that ranks at least as well as whatever we hold: follow it.

    Discovering: any leader. Campaigning: any leader, even one at a lower clock: a leader
    that speaks is alive, and a campaign exists only to find one (a node back from a pause
    campaigns at a clock its healthy master never reached; the master answers, and the node
    rejoins it instead of deposing it). Following:
    our master's own announcement refreshes it; another leader must rank at least as high
    as our master (a newer session takes over, an older or lower one is ignored: our master
    announces to it and it steps down). Leading is `settle_leader_conflict`'s case.
    """
    if msg.kind != "leader" or view.phase == "leading":
        return None
    if view.phase == "following":
        if msg.node_id == view.master_id and msg.session_id == view.session_id:
            # The announcement replaces the candidacy we chose it by (same rank): it took office.
            return dataclasses.replace(view, last_leader_heard_at=now, master_claim=msg), []
        if view.master_claim is not None and rank(msg) < rank(view.master_claim):
            return None
    return _follow(view, msg, now)


def settle_leader_conflict(view: ElectionView, msg: ElectionMessage, now: float) -> Step | None:
    """Leading and another leader speaks: the lower one steps down.

    If it outranks me I follow it; otherwise I re-announce at once so it hears me and steps
    down within one message instead of one announce period.
    """
    if msg.kind != "leader" or view.phase != "leading":
        return None
    assert view.my_claim is not None
    if rank(msg) > rank(view.my_claim):
        return _follow(view, msg, now)
    return _announce(view, now)


def join_higher_campaign(view: ElectionView, msg: ElectionMessage, me: Me, now: float) -> Step | None:
    """A candidate at a later clock: the cluster may be re-electing; take part, unless this
    node leads or follows a master it heard within LEADER_SILENCE_S. A healthy master is
    never deposed by a campaign: it answers the candidate with its announcement
    (`answer_candidate`), which the candidate adopts."""
    if msg.kind != "candidate" or msg.clock <= view.clock:
        return None
    if view.phase == "leading" or (view.phase == "following" and _master_live(view, now)):
        return None
    return _start_campaign(view, msg.clock, me, now, seen=msg)


def record_candidate(view: ElectionView, msg: ElectionMessage) -> Step | None:
    """Campaigning: a candidate at our clock counts when the window closes."""
    if msg.kind != "candidate" or view.phase != "campaigning" or msg.clock != view.clock:
        return None
    return dataclasses.replace(view, candidates=_with_candidate(view.candidates, msg, view.my_claim)), []


def support_chosen_candidate(view: ElectionView, msg: ElectionMessage) -> Step | None:
    """Following the candidate my campaign chose, which still campaigns at my clock: it lost
    the master later than I did and began campaigning after my window closed, so it never
    heard my candidacy and lacks the member majority to decide (`has_quorum`). Repeat my
    (frozen) candidacy so it counts me; without this it would campaign forever while I
    wait for its announcement."""
    if msg.kind != "candidate" or view.phase != "following" or msg.node_id != view.master_id:
        return None
    if msg.clock != view.clock or view.my_claim is None or view.my_claim.clock != view.clock:
        return None
    return view, [Broadcast(view.my_claim)]


def answer_candidate(view: ElectionView, msg: ElectionMessage, now: float) -> Step | None:
    """Leading and any candidate (a newcomer, a stale node, a node back from a partition or
    a pause at a higher clock): my announcement brings it in. Other phases ignore such
    candidates; the leader answers."""
    if msg.kind != "candidate" or view.phase != "leading":
        return None
    return _announce(view, now)


# -- presence rules ------------------------------------------------------------------------


def campaign_when_master_left(view: ElectionView, me: Me, now: float) -> Step | None:
    """Following a master presence says has left: re-elect without waiting for silence.
    (Only the master's departure: joins and other departures never start a campaign. Not
    while deaf: a deaf node's presence drops its master for unanswered challenges it may
    simply not have heard answered.)"""
    if view.phase != "following" or me.deaf_for_s > 0 or view.master_id is None \
            or view.master_id not in view.departed:
        return None
    return _start_campaign(view, view.clock + 1, me, now)


def _track_presence(view: ElectionView, live: frozenset[str]) -> ElectionView:
    left = sorted(view.live_peers - live)
    departed = tuple(n for n in view.departed if n not in live and n not in left) + tuple(left)
    return dataclasses.replace(view, live_peers=live, departed=departed[-MAX_DEPARTED_TRACKED:])


# -- transitions ---------------------------------------------------------------------------


def _start_campaign(
    view: ElectionView, clock: int, me: Me, now: float, seen: ElectionMessage | None = None
) -> Step:
    claim = ElectionMessage(
        kind="candidate",
        node_id=NodeId(me.node_id),
        clock=clock,
        seniority=me.seniority,
        commands_seen=me.commands_seen,
    )
    candidates: Mapping[str, ElectionMessage] = {me.node_id: claim}
    if seen is not None and seen.node_id not in view.departed:
        candidates = _with_candidate(candidates, seen, claim)
    new = dataclasses.replace(
        view,
        phase="campaigning",
        clock=clock,
        campaign_deadline=now + CAMPAIGN_WINDOW_S,
        candidates=candidates,
        my_claim=claim,
        master_claim=None,
        last_leader_heard_at=None,
        last_broadcast_at=now,
    )
    return new, [Broadcast(claim)]


def _lead(view: ElectionView, now: float) -> Step:
    assert view.my_claim is not None
    session = session_id_for(view.my_claim.node_id, view.clock)
    new = dataclasses.replace(
        view,
        phase="leading",
        master_id=view.my_claim.node_id,
        session_id=session,
        campaign_deadline=None,
        candidates={},
        master_claim=view.my_claim,
        last_leader_heard_at=None,
    )
    announced, broadcasts = _announce(new, now)
    return announced, [*_elected_if_new(view, announced, i_am_master=True), *broadcasts]


def _follow(view: ElectionView, master: ElectionMessage, now: float) -> Step:
    """Follow `master` (a leader message, or the candidacy that won our campaign)."""
    session = master.session_id or session_id_for(master.node_id, master.clock)
    new = dataclasses.replace(
        view,
        phase="following",
        clock=max(view.clock, master.clock),
        master_id=master.node_id,
        session_id=session,
        campaign_deadline=None,
        candidates={},
        my_claim=None,
        master_claim=master,
        last_leader_heard_at=now,
    )
    return new, _elected_if_new(view, new, i_am_master=False)


def _announce(view: ElectionView, now: float) -> Step:
    assert view.my_claim is not None and view.session_id is not None
    message = ElectionMessage(
        kind="leader",
        node_id=view.my_claim.node_id,
        clock=view.clock,
        seniority=view.my_claim.seniority,
        commands_seen=view.my_claim.commands_seen,
        session_id=SessionId(view.session_id),
    )
    return dataclasses.replace(view, last_broadcast_at=now), [Broadcast(message)]


def _elected_if_new(old: ElectionView, new: ElectionView, *, i_am_master: bool) -> list[Output]:
    if (old.master_id, old.session_id) == (new.master_id, new.session_id):
        return []
    assert new.master_id is not None and new.session_id is not None
    return [Elected(master_id=new.master_id, session_id=new.session_id, clock=new.clock, i_am_master=i_am_master)]


def _with_candidate(
    candidates: Mapping[str, ElectionMessage], msg: ElectionMessage, mine: ElectionMessage | None
) -> Mapping[str, ElectionMessage]:
    updated = {**candidates, msg.node_id: msg}
    if len(updated) > MAX_CANDIDATES:
        # Forget the lowest-ranked other candidate: it could never have won.
        others = [c for c in updated.values() if mine is None or c.node_id != mine.node_id]
        del updated[min(others, key=rank).node_id]
    return updated


def _pass_over(passed_over: Mapping[str, float], node_id: str, now: float) -> Mapping[str, float]:
    """`passed_over` with `node_id` passed over for WINNER_PASS_OVER_S; expired entries dropped
    and at most MAX_PASSED_OVER kept (those expiring last)."""
    updated = {n: until for n, until in passed_over.items() if until > now}
    updated[node_id] = now + WINNER_PASS_OVER_S
    return dict(sorted(updated.items(), key=lambda item: item[1])[-MAX_PASSED_OVER:])


def _master_live(view: ElectionView, now: float) -> bool:
    """The master this node follows announced within LEADER_SILENCE_S."""
    return view.last_leader_heard_at is not None and now - view.last_leader_heard_at < LEADER_SILENCE_S


# -- when the next tick is needed ------------------------------------------------------------

MAX_TICK_GAP_S: Final = 1.0
"""The longest the shell goes without a tick. Below STALL_HOLD_AFTER_S, so a leader that
ticks on time never looks stalled (the shell's `may_index`), and a stall is measured as
how late a tick came."""

DEAF_POLL_S: Final = 0.25
"""While deaf, how often to tick: deafness ends with any message heard, which the election
does not see, so the rules it holds back (`notice_leader_silence`) are re-checked this often."""


def next_tick_in_s(view: ElectionView, me: Me, now: float) -> float:
    """How long until a tick rule (`_on_tick`) may next apply: the earliest of the phase's
    deadlines, at most MAX_TICK_GAP_S, never below 0. An idle leader or follower ticks about
    once a second instead of four times; each rule still fires when its time comes (the
    shell ticks again at once after any input that moves a deadline)."""
    due = [now + MAX_TICK_GAP_S]
    if view.phase == "discovering":
        due.append(view.started_at + DISCOVERY_S)
    elif view.phase == "campaigning":
        due += [view.campaign_deadline if view.campaign_deadline is not None else now,
                _next_due(view.last_broadcast_at, now, CANDIDATE_REBROADCAST_S)]
    elif view.phase == "following":
        due.append(now + DEAF_POLL_S if me.deaf_for_s > 0
                   else _next_due(view.last_leader_heard_at, now, LEADER_SILENCE_S))
    else:
        due += [_next_due(view.last_broadcast_at, now, LEADER_ANNOUNCE_S),
                now + max(0.0, DEAF_LEADER_STEP_DOWN_S - me.deaf_for_s)]
    return max(0.0, min(due) - now)


def _next_due(last: float | None, now: float, period_s: float) -> float:
    return now if last is None else last + period_s


def _due(last: float | None, now: float, period_s: float) -> bool:
    return last is None or now - last >= period_s


__all__ = [
    "CAMPAIGN_WINDOW_S",
    "CANDIDATE_REBROADCAST_S",
    "DEAF_LEADER_STEP_DOWN_S",
    "DEAF_POLL_S",
    "DISCOVERY_S",
    "LEADER_ANNOUNCE_S",
    "LEADER_SILENCE_S",
    "MAX_CANDIDATES",
    "MAX_DEPARTED_TRACKED",
    "MAX_PASSED_OVER",
    "MAX_TICK_GAP_S",
    "STALL_HOLD_AFTER_S",
    "STALL_HOLD_S",
    "WINNER_PASS_OVER_S",
    "Broadcast",
    "Elected",
    "ElectionMessage",
    "ElectionView",
    "Input",
    "Me",
    "Output",
    "Phase",
    "PresenceChanged",
    "Received",
    "Tick",
    "announce_leadership",
    "initial_view",
    "is_leading",
    "next_tick_in_s",
    "rank",
    "session_id_for",
    "stall_hold_until",
    "step",
]
