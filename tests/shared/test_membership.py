import itertools

import pytest

from skulk.shared.membership import MembershipView, SelfInfo, plan_membership
from skulk.shared.types.common import Edge, NetworkInterface
from skulk.shared.types.events import NodeJoined, NodeNetworkUpdated, TopologyEdgeCreated, TopologyEdgeDeleted
from skulk.shared.types.state import NodeInfo, State

ME = SelfInfo(node_id="a", node_name="alpha", version="1", api_endpoint="http://127.0.0.1:1")
JOINED = State(nodes={"a": NodeInfo(node_id="a", node_name="alpha", version="1", api_endpoint="http://127.0.0.1:1")})


def ids():
    counter = itertools.count()
    return lambda: f"e{next(counter)}"


def session(sink):
    return Edge(source="a", sink=sink, kind="session")


def summary(proposals):
    out = []
    for _key, event in proposals:
        if isinstance(event, NodeJoined):
            out.append("join")
        elif isinstance(event, TopologyEdgeCreated):
            out.append(f"+{event.edge.sink}/{event.edge.kind}")
        elif isinstance(event, NodeNetworkUpdated):
            out.append("net")
        elif isinstance(event, TopologyEdgeDeleted):
            out.append(f"-{event.edge.sink}/{event.edge.kind}")
    return out


@pytest.mark.parametrize(
    ("state", "live", "probed", "expected"),
    [
        (State(), frozenset({"b"}), {}, ["join"]),  # not a member yet: join before any edge
        (JOINED, frozenset(), {}, []),
        (JOINED, frozenset({"b", "c"}), {}, ["+b/session", "+c/session"]),
        (JOINED.model_copy(update={"edges": [session("b")]}), frozenset({"b"}), {}, []),
        (JOINED.model_copy(update={"edges": [session("b")]}), frozenset(), {}, ["-b/session"]),
        (JOINED, frozenset(), {"b": "http://10.0.0.2:52415"}, ["+b/probed"]),
        (JOINED.model_copy(update={"edges": [Edge(source="a", sink="b", kind="probed", address="x")]}),
         frozenset(), {"b": "y"}, ["+b/probed", "-b/probed"]),
        # Edges of other nodes are not ours to manage.
        (JOINED.model_copy(update={"edges": [Edge(source="c", sink="b", kind="session")]}), frozenset(), {}, []),
        # Changed identity (e.g. a new API endpoint) re-joins.
        (State(nodes={"a": NodeInfo(node_id="a", node_name="old", version="1")}), frozenset(), {}, ["join"]),
    ],
)
def test_plan_membership(state, live, probed, expected):
    view = MembershipView(state=state, me=ME, live_peers=live, probed=probed)
    assert summary(plan_membership(view, ids())) == expected


def test_pending_facts_are_not_proposed_again():
    view = MembershipView(state=JOINED, me=ME, live_peers=frozenset({"b"}))
    first = plan_membership(view, ids())
    assert summary(first) == ["+b/session"]
    pending = frozenset(key for key, _ in first)
    again = MembershipView(state=JOINED, me=ME, live_peers=frozenset({"b"}), pending=pending)
    assert plan_membership(again, ids()) == []


def test_network_facts_are_reported_when_they_change():
    lan = (NetworkInterface(name="eth0", addresses=["10.0.0.1"], kind="ethernet"),)
    me = SelfInfo(node_id="a", node_name="alpha", version="1", api_endpoint="http://127.0.0.1:1", interfaces=lan)
    assert summary(plan_membership(MembershipView(state=JOINED, me=me, live_peers=frozenset()), ids())) == ["net"]
    reported = JOINED.model_copy(update={"node_network": {"a": list(lan)}})
    assert plan_membership(MembershipView(state=reported, me=me, live_peers=frozenset()), ids()) == []
