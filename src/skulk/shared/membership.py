"""What this node should tell the master about itself: membership and its own edges.

Pure. Each rule compares what replicated State says about this node with what the node
observes (its identity, the peers whose authenticated presence it sees, the peer addresses
its probes verified) and proposes the events that would make State true. Facts already
submitted and not yet confirmed are named by a key in `pending` and are not proposed again,
so the event log records changes, never heartbeats.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from skulk.shared.types.common import Edge, NetworkInterface
from skulk.shared.types.events import (
    Event,
    NodeJoined,
    NodeNetworkUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from skulk.shared.types.ids import EventId, NodeId
from skulk.shared.types.state import State


@dataclass(frozen=True)
class SelfInfo:
    node_id: NodeId
    node_name: str
    version: str
    api_endpoint: str | None
    interfaces: tuple[NetworkInterface, ...] = ()


@dataclass(frozen=True)
class MembershipView:
    state: State
    me: SelfInfo
    live_peers: frozenset[NodeId]
    probed: Mapping[NodeId, str] = field(default_factory=dict[NodeId, str])
    """Peer -> an advertised address of it that this node verified (answered with its id)."""
    pending: frozenset[Hashable] = frozenset()


Proposal = tuple[Hashable, Event]


def _joined(view: MembershipView, new_id: Callable[[], str]) -> list[Proposal]:
    me = view.me
    info = view.state.nodes.get(me.node_id)
    current = (info.node_name, info.version, info.api_endpoint) if info else None
    if current == (me.node_name, me.version, me.api_endpoint):
        return []
    event = NodeJoined(event_id=EventId(new_id()), node_id=me.node_id, node_name=me.node_name, version=me.version,
                       api_endpoint=me.api_endpoint)
    return [(("joined", me.node_name, me.version, me.api_endpoint), event)]


def _network(view: MembershipView, new_id: Callable[[], str]) -> list[Proposal]:
    interfaces = list(view.me.interfaces)
    if view.state.node_network.get(view.me.node_id, []) == interfaces:
        return []
    event = NodeNetworkUpdated(event_id=EventId(new_id()), node_id=view.me.node_id, interfaces=interfaces)
    key = ("network", tuple((i.name, tuple(i.addresses), i.kind) for i in interfaces))
    return [(key, event)]


def _my_edges(view: MembershipView, kind: str) -> set[Edge]:
    return {e for e in view.state.edges if e.source == view.me.node_id and e.kind == kind}


def _edge_diff(view: MembershipView, desired: set[Edge], kind: str, new_id: Callable[[], str]) -> list[Proposal]:
    current = _my_edges(view, kind)
    proposals: list[Proposal] = []
    for edge in sorted(desired - current, key=Edge.sort_key):
        proposals.append((("edge+", edge), TopologyEdgeCreated(event_id=EventId(new_id()), edge=edge)))
    for edge in sorted(current - desired, key=Edge.sort_key):
        proposals.append((("edge-", edge), TopologyEdgeDeleted(event_id=EventId(new_id()), edge=edge)))
    return proposals


def _session_edges(view: MembershipView, new_id: Callable[[], str]) -> list[Proposal]:
    desired = {Edge(source=view.me.node_id, sink=peer, kind="session") for peer in view.live_peers}
    return _edge_diff(view, desired, "session", new_id)


def _probed_edges(view: MembershipView, new_id: Callable[[], str]) -> list[Proposal]:
    desired = {
        Edge(source=view.me.node_id, sink=peer, kind="probed", address=address)
        for peer, address in view.probed.items()
        if peer != view.me.node_id
    }
    return _edge_diff(view, desired, "probed", new_id)


def plan_membership(view: MembershipView, new_id: Callable[[], str]) -> list[Proposal]:
    """Join first; edges only once this node is a member (its edges must name a member)."""
    joined = _joined(view, new_id)
    if view.me.node_id not in view.state.nodes:
        proposals = joined
    else:
        proposals = joined + _network(view, new_id) + _session_edges(view, new_id) + _probed_edges(view, new_id)
    return [(key, event) for key, event in proposals if key not in view.pending]
