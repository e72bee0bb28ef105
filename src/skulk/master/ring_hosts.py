"""Choosing the address each rank of a multi-node MLX instance listens on for its ring.

Placement stamps these on `Instance.ring_hosts` so every rank reads the same answer from the
instance instead of guessing. Hosts only: the runners derive ports from the instance id (see
`skulk.worker.engines.mlx.group.ring_addresses`), so a re-placement is also a fresh port.

For rank r the candidates are the addresses at which other members of the instance have
already reached r's node (probed topology edges), else r's own interface addresses, ranked
by transport: Thunderbolt, then ethernet, Wi-Fi and others, with overlay/VPN addresses
(Tailscale's CGNAT range included) strictly last, and loopback never, because a neighbour
on another machine cannot use it. Pure: State in, list out; `[]` when every rank is on one
node (the runners then use loopback) or when some node has no usable address (the runner
then refuses with a clear reason instead of dialling a guess).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from skulk.shared.types.cards import backend_engine
from skulk.shared.types.common import NetworkInterface
from skulk.shared.types.engines import RING_ENGINES
from skulk.shared.types.ids import NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.state import State

KIND_RANK = {"thunderbolt": 0, "ethernet": 1, "wifi": 2, "other": 3, "overlay": 9}
"""Lower is preferred. Loopback interfaces are excluded, not ranked."""

OVERLAY_NETWORK = ipaddress.ip_network("100.64.0.0/10")
"""Carrier-grade NAT space, where Tailscale puts its addresses: an overlay whatever the
interface is called."""


def host_of(address: str) -> str | None:
    """The host part of an edge or interface address ('10.0.0.2', 'tcp/10.0.0.2:7447',
    'http://[fe80::1]:52415', '10.0.0.2/24'); None when it is not an IP address."""
    text = address.strip()
    if "://" in text:
        text = urlsplit(text).hostname or ""
    elif "/" in text and text.split("/", 1)[0].isalpha():  # zenoh style 'tcp/host:port'
        text = text.split("/", 1)[1]
    text = text.split("/", 1)[0]  # a CIDR suffix
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _rank(host: str, interfaces: Sequence[NetworkInterface]) -> int | None:
    ip = ipaddress.ip_address(host)
    if ip.is_loopback or ip.is_unspecified:
        return None
    kind = next((i.kind for i in interfaces if any(host_of(a) == host for a in i.addresses)), "other")
    if kind == "loopback":
        return None
    if ip.version == 4 and ip in OVERLAY_NETWORK:
        return KIND_RANK["overlay"]
    return KIND_RANK.get(kind, KIND_RANK["other"])


def node_host(node: NodeId, members: Sequence[NodeId], state: State) -> str | None:
    """The best address for `node` as seen from the other `members`."""
    interfaces = state.node_network.get(node, [])
    candidates: list[tuple[int, int, str]] = []
    for edge in state.edges:
        if edge.sink == node and edge.source in members and edge.address:
            host = host_of(edge.address)
            rank = _rank(host, interfaces) if host else None
            if rank is not None and host is not None:  # a rank implies a host
                candidates.append((rank, 0, host))  # reached by a member: preferred at equal rank
    for interface in interfaces:
        for address in interface.addresses:
            host = host_of(address)
            rank = _rank(host, interfaces) if host else None
            if rank is not None and host is not None:  # a rank implies a host
                candidates.append((rank, 1, host))
    return min(candidates)[2] if candidates else None


def choose_ring_hosts(node_ids: Sequence[NodeId], state: State) -> list[str]:
    """One host per rank (rank order), or [] (single node, or an address is unknown)."""
    if len(set(node_ids)) <= 1:
        return []
    members = list(dict.fromkeys(node_ids))
    hosts = {node: node_host(node, [m for m in members if m != node], state) for node in members}
    if any(host is None for host in hosts.values()):
        return []
    return [hosts[node] for node in node_ids]  # type: ignore[misc]



SPANNING_TRANSPORT_ENGINES = RING_ENGINES
"""Engines whose ranks dial each other (the `ranks_dial` engine trait)."""


def ring_hosts_for(instance: Instance, state: State) -> list[str]:
    """`choose_ring_hosts` for an MLX instance's ranks or a llama.cpp pool's; [] for other
    engines (their transport does not use the ring)."""
    if any(backend_engine(s.backend) not in SPANNING_TRANSPORT_ENGINES for s in instance.shards):
        return []
    return choose_ring_hosts(instance.node_ids(), state)


def unreported_ring_nodes(instance: Instance, state: State) -> list[NodeId]:
    """Nodes of a multi-node MLX instance that have not reported their network yet while
    others have: gossip is lagging, and an instance placed now gets no ring hosts (its
    runners then refuse to load, loudly). Not wired into `place` yet: raising
    PlacementInfoPending there would also make a repair skip its hop (repair treats every
    PlacementError as "this hop cannot place"). A state with no network reports at all (a
    bare test state) has nothing to wait for."""
    if not state.node_network or len(set(instance.node_ids())) <= 1:
        return []
    if any(backend_engine(s.backend) not in SPANNING_TRANSPORT_ENGINES for s in instance.shards):
        return []
    return sorted({n for n in instance.node_ids() if n not in state.node_network})


__all__ = ["KIND_RANK", "choose_ring_hosts", "host_of", "node_host", "ring_hosts_for", "unreported_ring_nodes"]
