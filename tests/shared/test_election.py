"""The election machine: each rule on small hand-built views, then whole clusters of
simulated nodes on an in-memory network with a fake clock (no event loop, no sockets)."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from skulk.shared.codec import round_trip
from skulk.shared.election import (
    CAMPAIGN_WINDOW_S,
    CANDIDATE_REBROADCAST_S,
    DEAF_LEADER_STEP_DOWN_S,
    DEAF_POLL_S,
    DISCOVERY_S,
    LEADER_ANNOUNCE_S,
    LEADER_SILENCE_S,
    MAX_CANDIDATES,
    MAX_PASSED_OVER,
    MAX_TICK_GAP_S,
    STALL_HOLD_AFTER_S,
    STALL_HOLD_S,
    WINNER_PASS_OVER_S,
    Broadcast,
    Elected,
    ElectionView,
    Me,
    Output,
    PresenceChanged,
    Received,
    Tick,
    initial_view,
    is_leading,
    next_tick_in_s,
    rank,
    session_id_for,
    stall_hold_until,
    step,
)
from skulk.shared.election_quorum import has_quorum
from skulk.shared.types.election import ElectionMessage

ME = Me(node_id="b", seniority=0, commands_seen=0)


def cand(node: str, clock: int, seniority: int = 0, commands_seen: int = 0) -> ElectionMessage:
    return ElectionMessage(kind="candidate", node_id=node, clock=clock, seniority=seniority, commands_seen=commands_seen)


def lead(node: str, clock: int, seniority: int = 0, commands_seen: int = 0) -> ElectionMessage:
    return ElectionMessage(
        kind="leader",
        node_id=node,
        clock=clock,
        seniority=seniority,
        commands_seen=commands_seen,
        session_id=session_id_for(node, clock),
    )


def run(view: ElectionView, *inputs: tuple[object, float], me: Me = ME) -> tuple[ElectionView, list[Output]]:
    """Feed (input, now) pairs in order; return the last view and every output."""
    outputs: list[Output] = []
    for inp, now in inputs:
        view, out = step(view, inp, me, now)
        outputs.extend(out)
    return view, outputs


# -- views to start rules from, built through the public API --------------------------------


def discovering() -> ElectionView:
    return initial_view(0.0)  # discovery ends at DISCOVERY_S


def campaigning() -> ElectionView:
    """Campaigning at clock 1 since t=2.0 (deadline 3.5), candidates: me only."""
    view, _ = run(discovering(), (Tick(), DISCOVERY_S))
    return view


def campaigning_high() -> ElectionView:
    """Campaigning at clock 5 (joined a's campaign) since t=2.0."""
    view, _ = run(discovering(), (Received(cand("a", 5)), 2.0))
    return view


def following() -> ElectionView:
    """Following c at clock 1 (session c.1), last heard at t=10, peers a and c live."""
    view, _ = run(discovering(), (PresenceChanged(frozenset({"a", "c"})), 9.0), (Received(lead("c", 1)), 10.0))
    return view


def leading() -> ElectionView:
    """Leading at clock 2 (session b.2) since t=1.5, last announced then."""
    view, _ = run(discovering(), (Received(cand("a", 2)), 0.0), (Tick(), CAMPAIGN_WINDOW_S))
    assert is_leading(view)
    return view


def summary(outputs: list[Output]) -> list[str]:
    def one(out: Output) -> str:
        if isinstance(out, Broadcast):
            return f"{out.message.kind}@{out.message.clock}"
        return f"elected {out.session_id}{' (me)' if out.i_am_master else ''}"

    return [one(o) for o in outputs]


RULES = [
    # id, start view, input, now, expected phase, clock, master, outputs
    ("discovering: quiet before DISCOVERY_S", discovering, Tick(), 1.75, "discovering", 0, None, []),
    ("discovering: campaign after DISCOVERY_S", discovering, Tick(), 2.0, "campaigning", 1, None, ["candidate@1"]),
    ("discovering: a leader is adopted at once", discovering, Received(lead("c", 4)), 0.5, "following", 4, "c",
     ["elected c.4"]),
    ("discovering: joins a running campaign", discovering, Received(cand("a", 3)), 0.5, "campaigning", 3, None,
     ["candidate@3"]),
    ("discovering: presence alone starts nothing", discovering, PresenceChanged(frozenset({"a"})), 0.5,
     "discovering", 0, None, []),
    ("campaigning: same-clock candidate is recorded", campaigning, Received(cand("c", 1)), 2.5, "campaigning", 1,
     None, []),
    ("campaigning: higher clock restarts", campaigning, Received(cand("a", 5)), 2.5, "campaigning", 5, None,
     ["candidate@5"]),
    ("campaigning: lower clock ignored", campaigning, Received(cand("a", 0)), 2.5, "campaigning", 1, None, []),
    ("campaigning: rebroadcast not yet due", campaigning, Tick(), 2.25, "campaigning", 1, None, []),
    ("campaigning: rebroadcast due", campaigning, Tick(), 2.0 + CANDIDATE_REBROADCAST_S, "campaigning", 1, None,
     ["candidate@1"]),
    ("campaigning: alone at deadline -> lead", campaigning, Tick(), 3.5, "leading", 1, "b",
     ["elected b.1 (me)", "leader@1"]),
    ("campaigning: leader at my clock is followed", campaigning, Received(lead("a", 1)), 2.5, "following", 1, "a",
     ["elected a.1"]),
    ("campaigning: leader at later clock is followed", campaigning, Received(lead("a", 3)), 2.5, "following", 3,
     "a", ["elected a.3"]),
    ("campaigning: a live leader at a lower clock is followed", campaigning_high, Received(lead("a", 1)), 2.5,
     "following", 5, "a", ["elected a.1"]),
    ("following: master's announcement refreshes", following, Received(lead("c", 1)), 12.0, "following", 1, "c",
     []),
    ("following: lower-ranked leader ignored", following, Received(lead("a", 1)), 12.0, "following", 1, "c", []),
    ("following: older-clock leader ignored", following, Received(lead("z", 0)), 12.0, "following", 1, "c", []),
    ("following: higher-ranked leader adopted", following, Received(lead("d", 1)), 12.0, "following", 1, "d",
     ["elected d.1"]),
    ("following: newer session adopted", following, Received(lead("a", 2)), 12.0, "following", 2, "a",
     ["elected a.2"]),
    ("following: stale candidate ignored", following, Received(cand("z", 1)), 12.0, "following", 1, "c", []),
    ("following: higher-clock candidate ignored while the master is live", following, Received(cand("a", 2)),
     12.0, "following", 1, "c", []),
    ("following: higher-clock candidate joined once the master is silent", following, Received(cand("a", 2)),
     10.0 + LEADER_SILENCE_S, "campaigning", 2, "c", ["candidate@2"]),
    ("following: quiet master within silence", following, Tick(), 10.0 + LEADER_SILENCE_S - 0.25, "following", 1,
     "c", []),
    ("following: silent master -> re-elect", following, Tick(), 10.0 + LEADER_SILENCE_S, "campaigning", 2, "c",
     ["candidate@2"]),
    ("following: master left presence -> re-elect", following, PresenceChanged(frozenset({"a"})), 11.0,
     "campaigning", 2, "c", ["candidate@2"]),
    ("following: a join never re-elects", following, PresenceChanged(frozenset({"a", "c", "z"})), 11.0,
     "following", 1, "c", []),
    ("following: another peer leaving never re-elects", following, PresenceChanged(frozenset({"c"})), 11.0,
     "following", 1, "c", []),
    ("leading: announce not yet due", leading, Tick(), 2.25, "leading", 2, "b", []),
    ("leading: periodic announce", leading, Tick(), 1.5 + LEADER_ANNOUNCE_S, "leading", 2, "b", ["leader@2"]),
    ("leading: lower leader -> re-announce", leading, Received(lead("a", 2)), 1.75, "leading", 2, "b",
     ["leader@2"]),
    ("leading: higher leader -> step down", leading, Received(lead("c", 2)), 1.75, "following", 2, "c",
     ["elected c.2"]),
    ("leading: newer-clock leader -> step down", leading, Received(lead("a", 3)), 1.75, "following", 3, "a",
     ["elected a.3"]),
    ("leading: straggler candidate -> re-announce", leading, Received(cand("z", 1)), 1.75, "leading", 2, "b",
     ["leader@2"]),
    ("leading: same-clock candidate -> re-announce", leading, Received(cand("z", 2)), 1.75, "leading", 2, "b",
     ["leader@2"]),
    ("leading: higher-clock candidate is answered, never deposes", leading, Received(cand("a", 3)), 1.75, "leading",
     2, "b", ["leader@2"]),
    ("any: own echo ignored", following, Received(lead("b", 9)), 12.0, "following", 1, "c", []),
]


@pytest.mark.parametrize(
    ("start", "inp", "now", "phase", "clock", "master", "outputs"),
    [pytest.param(*row[1:], id=row[0]) for row in RULES],
)
def test_rule(start: Callable[[], ElectionView], inp, now, phase, clock, master, outputs) -> None:
    view, out = step(start(), inp, ME, now)
    assert (view.phase, view.clock, view.master_id, summary(out)) == (phase, clock, master, outputs)


@pytest.mark.parametrize(
    ("recorded", "live_after", "winner"),
    [
        pytest.param([cand("c", 1)], {"a", "c"}, "c", id="best candidate wins"),
        pytest.param([cand("a", 1)], {"a"}, "b", id="I beat a lower candidate"),
        pytest.param([cand("c", 1)], {"a"}, "b", id="candidate that left presence does not count"),
        pytest.param([cand("a", 1, seniority=1)], {"a"}, "a", id="seniority before node id"),
        pytest.param([cand("a", 1, commands_seen=7)], {"a"}, "a", id="commands_seen before node id"),
        pytest.param([cand("a", 1, commands_seen=7), cand("c", 1, seniority=1)], {"a", "c"}, "c",
                     id="seniority before commands_seen"),
    ],
)
def test_campaign_winner(recorded: list[ElectionMessage], live_after: set[str], winner: str) -> None:
    view, _ = run(campaigning(), (PresenceChanged(frozenset({"a", "c"})), 2.0),
                  *[(Received(m), 2.25) for m in recorded],
                  (PresenceChanged(frozenset(live_after)), 3.0))
    view, out = step(view, Tick(), ME, 2.0 + CAMPAIGN_WINDOW_S)
    assert view.master_id == winner
    assert view.session_id == f"{winner}.1"
    assert [o for o in out if isinstance(o, Elected)] == [
        Elected(master_id=winner, session_id=f"{winner}.1", clock=1, i_am_master=winner == "b")
    ]


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ((1, 9, 9, "z"), (2, 0, 0, "a")),  # clock first
        ((1, 0, 9, "z"), (1, 1, 0, "a")),  # then seniority
        ((1, 1, 0, "z"), (1, 1, 1, "a")),  # then commands_seen
        ((1, 1, 1, "a"), (1, 1, 1, "b")),  # node id last
    ],
)
def test_rank_order(lower: tuple, higher: tuple) -> None:
    assert rank(cand(lower[3], *lower[:3])) < rank(cand(higher[3], *higher[:3]))


def test_claim_is_frozen_for_the_campaign() -> None:
    """My counters move during a campaign; what I broadcast (and announce as leader) does not,
    so every peer keeps ranking me the same way."""
    view, first = step(discovering(), Tick(), ME, DISCOVERY_S)
    busier = Me(node_id="b", seniority=0, commands_seen=50)
    view, again = step(view, Tick(), busier, DISCOVERY_S + CANDIDATE_REBROADCAST_S)
    view, won = step(view, Tick(), busier, DISCOVERY_S + CAMPAIGN_WINDOW_S)
    announced = [o.message for o in first + again + won if isinstance(o, Broadcast)]
    assert {m.commands_seen for m in announced} == {0}
    assert announced[-1].kind == "leader"


def test_elected_never_repeated_for_one_session() -> None:
    view = following()
    outputs: list[Output] = []
    for i in range(20):
        view, out = step(view, Received(lead("c", 1)), ME, 10.0 + i)
        outputs.extend(out)
        view, out = step(view, Tick(), ME, 10.5 + i)
        outputs.extend(out)
    assert outputs == [] and view.master_id == "c"


def test_departed_nodes_messages_ignored_until_they_return() -> None:
    view, _ = run(following(), (PresenceChanged(frozenset({"c"})), 11.0))  # a left
    assert step(view, Received(lead("a", 5)), ME, 11.5)[0].master_id == "c"
    view, _ = run(view, (PresenceChanged(frozenset({"a", "c"})), 12.0))  # a is back
    assert step(view, Received(lead("a", 5)), ME, 12.5)[0].master_id == "a"


def test_candidates_are_bounded_without_changing_the_winner() -> None:
    view = campaigning()
    for i in range(MAX_CANDIDATES + 50):
        view, _ = step(view, Received(cand(f"n{i:04d}", 1, commands_seen=i)), ME, 2.25)
    assert len(view.candidates) == MAX_CANDIDATES
    assert "b" in view.candidates
    view, _ = step(view, Tick(), ME, 3.5)
    assert view.master_id == f"n{MAX_CANDIDATES + 49:04d}"


@pytest.mark.parametrize(
    ("node", "clock", "expected"),
    [("c", 3, "c.3"), ("node_7-x.y", 12, "node_7-x.y.12")],
)
def test_session_id_derivation(node: str, clock: int, expected: str) -> None:
    assert session_id_for(node, clock) == expected


def test_session_id_of_a_long_node_id_stays_valid_and_deterministic() -> None:
    node = "n" * 128
    sid = session_id_for(node, 123456)
    assert sid == session_id_for(node, 123456) != session_id_for(node, 123457)
    assert len(sid) <= 128 and sid.endswith(".123456")


def test_wire_message_round_trips_and_rejects_bad_shapes() -> None:
    msg = lead("c", 3, seniority=2, commands_seen=9)
    assert round_trip(msg) == msg
    assert msg.to_wire()["commandsSeen"] == 9 and msg.to_wire()["type"] == "ElectionMessage"
    with pytest.raises(ValidationError):
        ElectionMessage(kind="leader", node_id="c", clock=1, seniority=0, commands_seen=0)
    with pytest.raises(ValidationError):
        ElectionMessage(kind="candidate", node_id="c", clock=1, seniority=0, commands_seen=0, session_id="c.1")
    with pytest.raises(ValidationError):
        ElectionMessage(kind="candidate", node_id="c", clock=-1, seniority=0, commands_seen=0)


# -- simulated clusters ----------------------------------------------------------------------

TICK_S = 0.25

Drop = Callable[[str, str, ElectionMessage], bool]


@dataclass
class SimNode:
    me: Me
    view: ElectionView
    elected: list[Elected] = field(default_factory=list)
    sent: list[ElectionMessage] = field(default_factory=list)
    running: bool = True  # stepped and reachable
    present: bool = True  # listed by presence
    members: frozenset[str] = frozenset()  # State.nodes as this node's replica has it
    deaf: bool = False  # hears and speaks, but its hearing rule says deaf: it decides nothing


class Cluster:
    """Nodes on an in-memory network: each Broadcast reaches every other running node at
    once, unless `drop(src, dst, message)` says that link loses it."""

    def __init__(self, mes: list[Me], drop: Drop | None = None) -> None:
        self.now = 0.0
        self.drop: Drop = drop or (lambda src, dst, msg: False)
        self.cut_off: set[str] = set()  # running nodes on the far side of a network cut
        self.nodes: dict[str, SimNode] = {}
        self._inflight: deque[tuple[str, ElectionMessage]] = deque()
        for me in mes:
            self.nodes[me.node_id] = SimNode(me=me, view=initial_view(self.now))
        self.publish_presence()

    def join(self, me: Me) -> None:
        self.nodes[me.node_id] = SimNode(me=me, view=initial_view(self.now))
        self.publish_presence()

    def kill(self, name: str) -> None:
        self.nodes[name].running = self.nodes[name].present = False
        self.publish_presence()

    def freeze(self, name: str) -> None:
        """Hung process: stops speaking, but its presence token lives on."""
        self.nodes[name].running = False

    def pause(self, name: str) -> None:
        """SIGSTOP: stops speaking, and its presence goes once the transport lease ends."""
        self.kill(name)

    def resume(self, name: str) -> None:
        """SIGCONT (or a healed partition): the node speaks again, with the view it had."""
        self.nodes[name].running = self.nodes[name].present = True
        self.publish_presence()

    def cut(self, name: str) -> None:
        """A network cut: the node keeps running, but it and the others lose each other's
        messages and presence."""
        self.cut_off.add(name)
        self.publish_presence()

    def heal(self, name: str) -> None:
        self.cut_off.discard(name)
        self.publish_presence()

    def set_members(self, members: set[str], *, on: set[str] | None = None) -> None:
        """What the State lists as members on `on` (default every node): only a live master
        changes it, so a cut node keeps the list it had."""
        for name in on if on is not None else self.nodes:
            self.nodes[name].members = frozenset(members)

    def _linked(self, a: str, b: str) -> bool:
        return (a in self.cut_off) == (b in self.cut_off)

    def publish_presence(self) -> None:
        live = {n for n, node in self.nodes.items() if node.present}
        for name, node in self.nodes.items():
            if node.running:
                seen = {n for n in live if self._linked(name, n)}
                self._step(name, PresenceChanged(frozenset(seen - {name})))
        self._deliver()

    def run_until(self, t: float) -> None:
        while self.now < t:
            self.now += TICK_S
            for name, node in list(self.nodes.items()):
                if node.running:
                    self._step(name, Tick())
            self._deliver()

    def _step(self, name: str, inp: object) -> None:
        node = self.nodes[name]
        me_now = dataclasses.replace(node.me, members=node.members, deaf_for_s=1.0 if node.deaf else 0.0)
        node.view, out = step(node.view, inp, me_now, self.now)
        for o in out:
            if isinstance(o, Broadcast):
                node.sent.append(o.message)
                self._inflight.append((name, o.message))
            else:
                node.elected.append(o)

    def _deliver(self) -> None:
        delivered = 0
        while self._inflight:
            src, msg = self._inflight.popleft()
            for dst, node in self.nodes.items():
                if dst != src and node.running and self._linked(src, dst) and not self.drop(src, dst, msg):
                    self._step(dst, Received(msg))
            delivered += 1
            assert delivered < 10_000, "election messages never settle"

    # -- what tests assert on
    def running(self) -> dict[str, SimNode]:
        return {n: node for n, node in self.nodes.items() if node.running}

    def masters(self) -> set[tuple[str | None, str | None]]:
        return {(node.view.master_id, node.view.session_id) for node in self.running().values()}

    def leaders(self) -> list[str]:
        return [n for n, node in self.running().items() if is_leading(node.view)]


def me(name: str, seniority: int = 0, commands_seen: int = 0) -> Me:
    return Me(node_id=name, seniority=seniority, commands_seen=commands_seen)


def settled(cluster: Cluster) -> tuple[str, str]:
    """Assert the running nodes agree on one master that alone leads; return it."""
    masters = cluster.masters()
    assert len(masters) == 1, masters
    ((master, session),) = masters
    assert cluster.leaders() == [master]
    assert master is not None and session is not None
    return master, session


def test_simultaneous_start_elects_the_highest_node_once() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(DISCOVERY_S + CAMPAIGN_WINDOW_S)
    assert settled(cluster) == ("c", "c.1")
    cluster.run_until(30.0)
    assert settled(cluster) == ("c", "c.1")
    for name, node in cluster.nodes.items():
        assert node.elected == [Elected("c", "c.1", 1, i_am_master=name == "c")]


@pytest.mark.parametrize("newcomer", [me("d"), me("z", seniority=9, commands_seen=99)])
def test_late_joiner_adopts_the_leader_without_churn(newcomer: Me) -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    before = {n: list(node.elected) for n, node in cluster.nodes.items()}
    cluster.join(newcomer)
    cluster.run_until(10.0 + LEADER_ANNOUNCE_S)
    assert settled(cluster) == ("c", "c.1")
    cluster.run_until(30.0)
    assert settled(cluster) == ("c", "c.1")
    assert {n: node.elected for n, node in cluster.nodes.items() if n != newcomer.node_id} == before
    assert cluster.nodes[newcomer.node_id].elected == [Elected("c", "c.1", 1, i_am_master=False)]
    assert cluster.nodes[newcomer.node_id].sent == []  # never campaigned


def test_leader_leaving_presence_is_replaced_quickly() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    cluster.kill("c")
    cluster.run_until(10.0 + CAMPAIGN_WINDOW_S + TICK_S)  # well inside LEADER_SILENCE_S
    assert settled(cluster) == ("b", "b.2")
    assert cluster.nodes["a"].elected[-1] == Elected("b", "b.2", 2, i_am_master=False)
    assert cluster.nodes["b"].elected[-1] == Elected("b", "b.2", 2, i_am_master=True)


def test_silent_leader_is_replaced_after_silence_timeout() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    cluster.freeze("c")  # presence still lists it
    cluster.run_until(10.0 + LEADER_SILENCE_S - 1.0)
    assert cluster.masters() == {("c", "c.1")}
    cluster.run_until(10.0 + LEADER_SILENCE_S + CAMPAIGN_WINDOW_S + TICK_S)
    assert settled(cluster) == ("b", "b.2")


@pytest.mark.parametrize(
    ("island", "mainland", "expected"),
    [
        pytest.param(me("a"), [me("b"), me("c")], "c", id="mainland leader outranks"),
        pytest.param(me("a", seniority=3), [me("b"), me("c")], "a", id="senior island leader takes over"),
    ],
)
def test_split_brain_converges_on_the_higher_leader(island: Me, mainland: list[Me], expected: str) -> None:
    healed = False

    def partition(src: str, dst: str, msg: ElectionMessage) -> bool:
        return not healed and "a" in (src, dst)

    cluster = Cluster([island, *mainland], drop=partition)
    cluster.run_until(10.0)
    assert sorted(cluster.leaders()) == ["a", "c"]  # two masters, one per side
    healed = True
    cluster.run_until(10.0 + 2 * LEADER_ANNOUNCE_S)
    assert settled(cluster) == (expected, f"{expected}.1")
    cluster.run_until(30.0)
    assert settled(cluster) == (expected, f"{expected}.1")


@pytest.mark.parametrize("link", [("a", "c"), ("b", "c"), ("a", "b")])
def test_lost_candidates_on_one_link_still_converge(link: tuple[str, str]) -> None:
    def lossy(src: str, dst: str, msg: ElectionMessage) -> bool:
        return msg.kind == "candidate" and {src, dst} == set(link)

    cluster = Cluster([me("a"), me("b"), me("c")], drop=lossy)
    cluster.run_until(DISCOVERY_S + CAMPAIGN_WINDOW_S + 2 * LEADER_ANNOUNCE_S)
    assert settled(cluster) == ("c", "c.1")
    cluster.run_until(30.0)
    assert settled(cluster) == ("c", "c.1")
    assert all(node.elected[-1].session_id == "c.1" for node in cluster.nodes.values())


@pytest.mark.parametrize(
    ("mes", "expected"),
    [
        pytest.param([me("a", seniority=2), me("b", seniority=1), me("c")], "a", id="most senior"),
        pytest.param([me("a", commands_seen=5), me("b", commands_seen=9), me("c")], "b", id="most commands seen"),
        pytest.param([me("a", 1, 1), me("b", 1, 9), me("c", 2, 0)], "c", id="seniority before commands"),
    ],
)
def test_seniority_and_commands_seen_decide_before_node_id(mes: list[Me], expected: str) -> None:
    cluster = Cluster(mes)
    cluster.run_until(10.0)
    assert settled(cluster) == (expected, f"{expected}.1")


def test_survivors_of_repeated_failures_keep_one_master() -> None:
    cluster = Cluster([me("a"), me("b"), me("c"), me("d")])
    cluster.run_until(10.0)
    cluster.kill("d")
    cluster.run_until(15.0)
    assert settled(cluster) == ("c", "c.2")
    cluster.freeze("c")
    cluster.run_until(30.0)
    assert settled(cluster) == ("b", "b.3")
    for node in cluster.running().values():
        sessions = [e.session_id for e in node.elected]
        assert len(sessions) == len(set(sessions)) == 3  # one Elected per session, never repeated


@pytest.mark.parametrize("presence_lost", [True, False], ids=["presence-lost", "presence-kept"])
@pytest.mark.parametrize("paused_s", [10.0, 40.0])
def test_a_node_back_from_a_pause_rejoins_and_never_deposes_the_master(presence_lost: bool, paused_s: float) -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    assert settled(cluster) == ("c", "c.1")
    before = {n: list(node.elected) for n, node in cluster.nodes.items()}
    (cluster.pause if presence_lost else cluster.freeze)("a")
    cluster.run_until(10.0 + paused_s)
    cluster.resume("a")  # its clock reads LEADER_SILENCE_S long past: it campaigns at once
    cluster.run_until(10.0 + paused_s + 30.0)
    assert settled(cluster) == ("c", "c.1")
    assert {n: node.elected for n, node in cluster.nodes.items()} == before  # no new session anywhere
    assert any(m.kind == "candidate" and m.clock == 2 for m in cluster.nodes["a"].sent)  # it did campaign


def test_a_paused_master_that_returns_follows_its_successor() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    cluster.pause("c")
    cluster.run_until(20.0)
    assert settled(cluster) == ("b", "b.2")
    cluster.resume("c")  # still believes it leads session c.1
    cluster.run_until(40.0)
    assert settled(cluster) == ("b", "b.2")


# -- a node cut off by the network (it keeps running) ------------------------------------------


@pytest.mark.parametrize(
    ("members", "candidates", "me", "decides"),
    [
        pytest.param(set(), set(), "a", True, id="no members known: a cold start decides alone"),
        pytest.param({"a", "b"}, set(), "a", True, id="two members: a survivor decides alone"),
        pytest.param({"a", "b", "c"}, {"b"}, "a", True, id="two of three"),
        pytest.param({"a", "b", "c"}, set(), "a", False, id="one of three: cut off"),
        pytest.param({"a", "b", "c", "d"}, {"b"}, "a", False, id="half of four is no majority"),
        pytest.param({"a", "b", "c", "d"}, {"b", "c"}, "a", True, id="three of four"),
        pytest.param({"a", "b", "c"}, {"x", "y"}, "a", False, id="non-member candidates do not count"),
        pytest.param({"b", "c", "d"}, {"b", "c", "d"}, "a", False, id="a non-member never decides"),
        pytest.param({"b", "c"}, {"b"}, "a", False, id="pruned: two members left, still not one of them"),
        pytest.param({"a", "b", "c"}, {"a", "x", "y"}, "a", False, id="candidates that are not members"),
    ],
)
def test_quorum_table(members: set[str], candidates: set[str], me: str, decides: bool) -> None:
    assert has_quorum(frozenset(members), frozenset(candidates), me) is decides


@pytest.mark.parametrize("cut_s", [5.0, 60.0])
def test_a_cut_follower_never_leads_and_rejoins_the_master_when_the_link_heals(cut_s: float) -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    assert settled(cluster) == ("c", "c.1")
    before = {n: list(node.elected) for n, node in cluster.nodes.items()}
    cluster.cut("a")
    cluster.run_until(12.0)
    cluster.set_members({"b", "c"}, on={"b", "c"})  # the master prunes the lost node
    cluster.run_until(10.0 + cut_s)
    assert cluster.leaders() == ["c"]  # the cut node campaigns but never leads
    assert cluster.nodes["a"].view.phase == "campaigning"
    cluster.heal("a")
    cluster.run_until(10.0 + cut_s + 2 * LEADER_ANNOUNCE_S)
    assert settled(cluster) == ("c", "c.1")
    cluster.run_until(10.0 + cut_s + 30.0)
    assert settled(cluster) == ("c", "c.1")
    assert {n: node.elected for n, node in cluster.nodes.items()} == before  # no new session anywhere


def test_a_cut_node_that_still_sees_a_peers_presence_does_not_lead() -> None:
    """Presence behind a cut goes link by link: the master's first, another peer's seconds
    later. A peer that merely looks present is no vote: only candidacies count."""
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.cut_off.add("a")  # messages stop; a still lists b's presence for a while
    cluster._step("a", PresenceChanged(frozenset({"b"})))
    cluster.run_until(10.0 + 3 * CAMPAIGN_WINDOW_S)
    assert cluster.nodes["a"].view.phase == "campaigning"
    assert cluster.leaders() == ["c"]
    cluster.heal("a")
    cluster.run_until(20.0)
    assert settled(cluster) == ("c", "c.1")


def test_a_cut_master_is_replaced_by_the_majority_and_follows_it_when_the_link_heals() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.cut("c")
    cluster.run_until(10.0 + CAMPAIGN_WINDOW_S + TICK_S)
    assert cluster.nodes["b"].view.session_id == cluster.nodes["a"].view.session_id == "b.2"
    cluster.heal("c")
    cluster.run_until(20.0)
    assert settled(cluster) == ("b", "b.2")


def test_without_members_a_cut_node_leads_alone_and_deposes_the_master_on_heal() -> None:
    """What the member majority prevents: the same cut, with no members known."""
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.run_until(10.0)
    cluster.cut("a")
    cluster.run_until(20.0)
    assert sorted(cluster.leaders()) == ["a", "c"]
    cluster.heal("a")
    cluster.run_until(30.0)
    assert settled(cluster) == ("a", "a.2")


def test_with_members_the_survivors_of_a_master_death_still_elect_at_once() -> None:
    """The member majority costs a real failover nothing: both survivors campaign."""
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.kill("c")
    cluster.run_until(10.0 + CAMPAIGN_WINDOW_S + TICK_S)
    assert settled(cluster) == ("b", "b.2")


def test_with_members_a_lone_survivor_of_three_waits_for_a_second_member() -> None:
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.kill("c")
    cluster.kill("b")
    cluster.run_until(30.0)
    assert cluster.leaders() == []
    cluster.resume("b")
    cluster.run_until(30.0 + 2 * CAMPAIGN_WINDOW_S + TICK_S)
    assert settled(cluster)[0] in {"a", "b"}


def test_a_candidate_that_missed_my_candidacy_is_counted_by_the_one_that_chose_it() -> None:
    """Survivor a hears b's candidacy and, its window closed, follows b; b never heard a's
    (lost, or b began after a stopped rebroadcasting), so b lacks the member majority. a
    repeats its candidacy when b's rebroadcast reaches it, and b decides."""
    lossy = True

    def drop(src: str, dst: str, msg: ElectionMessage) -> bool:
        return lossy and (src, dst, msg.kind) == ("a", "b", "candidate")

    cluster = Cluster([me("a"), me("b"), me("c")], drop=drop)
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.kill("c")
    cluster.run_until(10.0 + CAMPAIGN_WINDOW_S + TICK_S)
    assert (cluster.nodes["a"].view.phase, cluster.nodes["a"].view.master_id) == ("following", "b")
    assert cluster.nodes["b"].view.phase == "campaigning"  # without a's vote: no majority
    lossy = False
    cluster.run_until(10.0 + 3 * CAMPAIGN_WINDOW_S)
    assert settled(cluster) == ("b", "b.2")


def test_a_cut_node_that_learns_it_was_pruned_before_hearing_the_leader_does_not_lead() -> None:
    """On heal the master's event burst (pruning the cut node) can arrive before its
    announcement: two members are left, and the cut node is not one of them."""
    cluster = Cluster([me("a"), me("b"), me("c")])
    cluster.set_members({"a", "b", "c"})
    cluster.run_until(10.0)
    cluster.cut("a")
    cluster.run_until(12.0)
    cluster.set_members({"b", "c"})  # everywhere, the cut node too (the burst arrived)
    cluster.run_until(12.0 + 3 * CAMPAIGN_WINDOW_S)
    assert cluster.nodes["a"].view.phase == "campaigning"
    cluster.heal("a")
    cluster.run_until(20.0)
    assert settled(cluster) == ("c", "c.1")


DEAF = dataclasses.replace(ME, deaf_for_s=1.0)
LONG_DEAF = dataclasses.replace(ME, deaf_for_s=DEAF_LEADER_STEP_DOWN_S)

DEAF_RULES = [
    # id, start view, me, input, now, expected phase, clock, master, outputs
    ("deaf campaigning: alone at deadline decides nothing", campaigning, DEAF, Tick(), 3.5, "campaigning", 1, None,
     []),
    ("deaf campaigning: still adopts a leader it hears", campaigning, DEAF, Received(lead("a", 1)), 2.5, "following",
     1, "a", ["elected a.1"]),
    ("deaf leading: announces until the step-down delay", leading,
     dataclasses.replace(ME, deaf_for_s=DEAF_LEADER_STEP_DOWN_S - 0.25), Tick(), 1.5 + LEADER_ANNOUNCE_S, "leading",
     2, "b", ["leader@2"]),
    ("deaf leading: steps down and campaigns after the delay", leading, LONG_DEAF, Tick(), 1.5 + LEADER_ANNOUNCE_S,
     "campaigning", 3, "b", ["candidate@3"]),
    ("hearing leading: never steps down", leading, ME, Tick(), 100.0, "leading", 2, "b", ["leader@2"]),
    ("deaf following: a silent master starts no campaign", following, DEAF, Tick(), 10.0 + LEADER_SILENCE_S,
     "following", 1, "c", []),
    ("deaf following: the master's lost presence starts no campaign", following, DEAF,
     PresenceChanged(frozenset({"a"})), 11.0, "following", 1, "c", []),
    ("deaf following: the master's announcement still refreshes", following, DEAF, Received(lead("c", 1)), 12.0,
     "following", 1, "c", []),
]


@pytest.mark.parametrize(
    ("start", "me", "inp", "now", "phase", "clock", "master", "outputs"),
    [pytest.param(*row[1:], id=row[0]) for row in DEAF_RULES],
)
def test_deaf_rule(start: Callable[[], ElectionView], me: Me, inp, now, phase, clock, master, outputs) -> None:
    view, out = run(start(), (inp, now), me=me)
    assert (view.phase, view.clock, view.master_id, summary(out)) == (phase, clock, master, outputs)


def test_a_resumed_deaf_leader_adopts_the_newer_session_once_it_hears_again() -> None:
    """Issue 18 (b): b led session b.2, was paused; a and c elected a.3 meanwhile. b resumes
    deaf: it steps down, campaigns without deciding, and follows a.3 when it hears it."""
    view, out = run(leading(), (Tick(), 20.0), me=LONG_DEAF)
    assert (view.phase, summary(out)) == ("campaigning", ["candidate@3"])
    view, out = run(view, (Tick(), 22.0), (Tick(), 24.0), me=LONG_DEAF)
    assert view.phase == "campaigning"
    assert not [o for o in out if not isinstance(o, Broadcast) or o.message.kind != "candidate"]
    view, out = run(view, (Received(lead("a", 3)), 25.0), me=DEAF)
    assert (view.phase, view.session_id, summary(out)) == ("following", "a.3", ["elected a.3"])


# -- a winner that never takes office ----------------------------------------------------------


def chose_c_at(now: float) -> ElectionView:
    """b campaigned at clock 1 with c's better candidacy recorded, and followed c at `now`."""
    view, _ = run(campaigning(), (Received(cand("c", 1, seniority=9)), 2.5))
    view, out = run(view, (Tick(), now))
    assert (view.phase, view.master_id, view.master_claim and view.master_claim.kind) == ("following", "c", "candidate")
    assert summary(out) == ["elected c.1"]
    return view


def test_a_winner_that_never_announces_is_passed_over_at_the_next_campaign() -> None:
    view = chose_c_at(3.5)
    view, out = run(view, (Tick(), 3.5 + LEADER_SILENCE_S))
    assert (view.phase, view.clock, summary(out)) == ("campaigning", 2, ["candidate@2"])
    assert view.passed_over == {"c": 3.5 + LEADER_SILENCE_S + WINNER_PASS_OVER_S}
    # c joins the new campaign with the better rank; b elects itself anyway
    view, out = run(view, (Received(cand("c", 2, seniority=9)), 10.0), (Tick(), 3.5 + LEADER_SILENCE_S + CAMPAIGN_WINDOW_S))
    assert (view.phase, view.master_id, summary(out)) == ("leading", "b", ["elected b.2 (me)", "leader@2"])


def test_a_winner_that_announced_is_not_passed_over_when_it_goes_silent() -> None:
    view = chose_c_at(3.5)
    view, _ = run(view, (Received(lead("c", 1, seniority=9)), 4.0))
    assert view.master_claim is not None and view.master_claim.kind == "leader"
    view, out = run(view, (Tick(), 4.0 + LEADER_SILENCE_S))
    assert (view.phase, summary(out), dict(view.passed_over)) == ("campaigning", ["candidate@2"], {})


def test_a_pass_over_expires_and_a_passed_over_leader_that_speaks_is_adopted() -> None:
    view = chose_c_at(3.5)
    view, _ = run(view, (Tick(), 10.0))  # silence: campaigning at 2, c passed over until 70
    expired = dataclasses.replace(view, passed_over={"c": 11.0})
    after, out = run(expired, (Received(cand("c", 2, seniority=9)), 11.0), (Tick(), 11.5))
    assert (after.phase, after.master_id, summary(out)) == ("following", "c", ["elected c.2"])
    view, out = run(view, (Received(lead("c", 2, seniority=9)), 10.5))
    assert (view.phase, view.master_id, summary(out)) == ("following", "c", ["elected c.2"])


def test_passed_over_winners_are_bounded_keeping_the_latest() -> None:
    view = dataclasses.replace(
        chose_c_at(3.5), passed_over={f"n{i}": 10.0 + i for i in range(MAX_PASSED_OVER)})
    view, _ = run(view, (Tick(), 3.5 + LEADER_SILENCE_S))
    assert len(view.passed_over) == MAX_PASSED_OVER
    assert "c" in view.passed_over and "n0" not in view.passed_over


def test_a_deaf_best_candidate_is_elected_once_then_passed_over_and_the_cluster_settles() -> None:
    """Issue 18, chaos `kill9-master`: c (best rank) resumed from a pause hears and is heard,
    but its hearing rule says deaf for a while, so it decides nothing. Before the pass-over
    rule a and b elected c every 7.5 s (a new session each time, every stream failing)."""
    cluster = Cluster([me("a"), me("b"), me("c", seniority=9)])
    cluster.set_members({"a", "b", "c"})
    cluster.nodes["c"].deaf = True
    cluster.run_until(60.0)
    sessions = {e.session_id for e in cluster.nodes["a"].elected}
    assert len(sessions) == 2, sessions  # c.1 (chosen, never took office), then one that leads
    assert cluster.nodes["c"].view.phase == "following"
    master, _ = settled(cluster)
    assert master in {"a", "b"}
    cluster.nodes["c"].deaf = False  # c hears again: it follows, nothing changes
    cluster.run_until(120.0)
    assert settled(cluster)[0] == master and {e.session_id for e in cluster.nodes["a"].elected} == sessions


# -- a leader back from a stall ------------------------------------------------------------------

MEMBERS = frozenset({"a", "b", "c"})


@pytest.mark.parametrize(("start", "stalled_s", "members", "expected"), [
    pytest.param(leading, STALL_HOLD_AFTER_S, MEMBERS, 20.0 + STALL_HOLD_S, id="leading, stalled: holds"),
    pytest.param(leading, STALL_HOLD_AFTER_S - 0.25, MEMBERS, None, id="leading, a shorter stall: indexes on"),
    pytest.param(leading, 30.0, frozenset({"b"}), None, id="leading alone: nobody could have replaced it"),
    pytest.param(leading, 30.0, frozenset(), None, id="leading, no members known: nobody to fear"),
    pytest.param(following, 30.0, MEMBERS, None, id="following: indexes nothing anyway"),
])
def test_stall_hold(start: Callable[[], ElectionView], stalled_s: float, members: frozenset[str],
                    expected: float | None) -> None:
    assert stall_hold_until(start(), stalled_s, dataclasses.replace(ME, members=members), 20.0) == expected


def test_a_leader_back_from_a_stall_adopts_the_newer_session_it_hears() -> None:
    """Issue 18, chaos `sigstop-server` of the master: b led b.2 and was stopped; a and c
    elected a.3. b, holding its indexing (`stall_hold_until`), hears a.3 and follows it."""
    view, out = run(leading(), (Received(lead("a", 3)), 20.5))
    assert (view.phase, view.session_id, summary(out)) == ("following", "a.3", ["elected a.3"])


# -- when the shell ticks next ------------------------------------------------------------

DEAF = dataclasses.replace(ME, deaf_for_s=3.0)


@pytest.mark.parametrize(("name", "start", "me", "now", "wait_s"), [
    ("discovering: when discovery ends", discovering, ME, 1.5, DISCOVERY_S - 1.5),
    ("discovering, long before the end: the longest gap", discovering, ME, 0.0, MAX_TICK_GAP_S),
    ("campaigning: the next rebroadcast", campaigning, ME, DISCOVERY_S + 0.1, CANDIDATE_REBROADCAST_S - 0.1),
    ("following: the longest gap before the silence deadline", following, ME, 10.0, MAX_TICK_GAP_S),
    ("following: the silence deadline", following, ME, 15.5, 10.0 + LEADER_SILENCE_S - 15.5),
    ("following, the silence overdue: at once", following, ME, 17.0, 0.0),
    ("following while deaf: polled", following, DEAF, 10.0, DEAF_POLL_S),
    ("leading: the next announcement", leading, ME, CAMPAIGN_WINDOW_S + 0.4, LEADER_ANNOUNCE_S - 0.4),
    ("leading, deaf near the step-down", leading,
     dataclasses.replace(ME, deaf_for_s=DEAF_LEADER_STEP_DOWN_S - 0.1), CAMPAIGN_WINDOW_S, 0.1),
])
def test_next_tick_in_s(name, start, me, now, wait_s) -> None:
    assert next_tick_in_s(start(), me, now) == pytest.approx(wait_s), name


@pytest.mark.parametrize("start", [discovering, campaigning, campaigning_high, following, leading])
@pytest.mark.parametrize("me", [ME, DEAF, dataclasses.replace(ME, members=frozenset({"a", "b", "c"}))])
def test_no_tick_rule_applies_before_next_tick_in_s(start, me) -> None:
    # Ticked every 10 ms, the machine does nothing before the instant next_tick_in_s named,
    # and that instant is at most MAX_TICK_GAP_S away: ticking only then misses no rule.
    view = start()
    now = {"discovering": 0.0, "campaigning": DISCOVERY_S, "following": 10.0, "leading": CAMPAIGN_WINDOW_S}[view.phase]
    for _ in range(40):
        wait_s = next_tick_in_s(view, me, now)
        assert 0.0 <= wait_s <= MAX_TICK_GAP_S
        for k in range(int(wait_s / 0.01)):
            early = now + k * 0.01
            assert step(view, Tick(), me, early) == (view, []), (view.phase, early, now + wait_s)
        now += wait_s
        view, _ = step(view, Tick(), me, now)
