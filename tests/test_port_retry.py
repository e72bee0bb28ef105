"""The test kits' answer to a port taken between `free_port()` and a node's bind: the node
exits naming the port, and the kit starts it again on a fresh one (bounded)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.cluster import harness
from tests.cluster.harness import start_linked, wait_agreed
from tests.nodeproc import PORT_TRIES, PortTaken, listen_ports, taken_port

API_TAKEN = "2026-12-02 00:07:20,430 ERROR skulk.node: cannot listen on 127.0.0.1:57789: [Errno 98] Address already in use"
TRANSPORT_TAKEN = (
    "2026-12-02 00:07:20,068 ERROR skulk.node: cannot open the cluster transport: cannot open transport "
    "(listen=['tcp/127.0.0.1:57789'], connect=[]): Can not create a new TCP listener bound to "
    "tcp/127.0.0.1:57789: [127.0.0.1:57789: Address already in use (os error 98) at tcp.rs:61.]"
)


@pytest.mark.parametrize(("log", "ports", "expected"), [
    (API_TAKEN, [57789], 57789),
    (TRANSPORT_TAKEN, [4000, 57789], 57789),
    (API_TAKEN, [5778], None),  # a port whose digits start another port's is not it
    (API_TAKEN, [57788], None),
    ("ERROR skulk.node: cannot listen on 127.0.0.1:57789: [Errno 13] Permission denied", [57789], None),
    ("", [57789], None),
])
def test_taken_port_reads_the_nodes_own_bind_failure(log, ports, expected):
    assert taken_port(log, ports) == expected


def test_listen_ports_are_read_from_the_listen_arguments():
    args = ["--listen", "tcp/127.0.0.1:7001", "--node-name", "a", "--bootstrap-peers", "tcp/127.0.0.1:7002"]
    assert listen_ports(args) == [7001]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process holds for the whole test (what a racing test does)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_node_whose_api_port_was_taken_starts_again_on_another(spawn_node, held_port):
    # What a race leaves: the port the kit chose is held by someone else when the node binds.
    node = spawn_node("racer", port=held_port, port_tries=PORT_TRIES, extra_args=["--no-worker"])
    node.wait_ready()
    assert node.api_port != held_port
    assert node.get("/node_id").status_code == 200


def test_a_caller_chosen_port_is_never_changed(spawn_node, held_port):
    node = spawn_node("fixed", port=held_port, extra_args=["--no-worker"])
    with pytest.raises(PortTaken) as taken:
        node.wait_ready()
    assert taken.value.port == held_port == node.api_port


def test_linked_nodes_start_again_on_fresh_ports_when_a_transport_port_was_taken(spawn_node, held_port,
                                                                                  monkeypatch):
    handed_out: list[int] = []

    def racing_free_port() -> int:
        # The first port handed out is already taken by the time the node binds it.
        port = held_port if not handed_out else harness_free_port()
        handed_out.append(port)
        return port

    harness_free_port = harness.free_port
    monkeypatch.setattr(harness, "free_port", racing_free_port)
    nodes = start_linked(spawn_node, ["alpha", "beta"], extra_args=("--no-worker",))
    wait_agreed(nodes, members=2)
    assert handed_out[0] == held_port
    assert all(held_port not in listen_ports(node.extra_args) for node in nodes)
