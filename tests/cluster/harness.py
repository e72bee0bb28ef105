"""Helpers for multi-node tests: start linked nodes, read their cluster views, wait for agreement."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tests.nodeproc import PORT_TRIES, NodeProcess, PortTaken, free_port, wait_for

CONVERGE_DEADLINE_S = 45.0
"""A hang guard, not a performance bound: a noisy 2-core CI machine starts three Python
processes slowly. Benchmarks (bench/control_plane.py) report the real figures."""


def start_linked(spawn: Callable[..., NodeProcess], names: list[str], *, key: str = "test-cluster-key",
                 extra_args: tuple[str, ...] = (), envs: Mapping[str, Mapping[str, str]] | None = None,
                 ) -> list[NodeProcess]:
    """Start nodes that each listen on a loopback port and bootstrap from the first node
    (`envs`: extra environment per node name).

    A transport port taken between `free_port()` and a node's bind (`PortTaken`) restarts
    the whole set on fresh ports, PORT_TRIES starts in all: the others bootstrap from the
    first node's port, so one node cannot move alone."""
    for attempt in range(PORT_TRIES):
        ports = [free_port() for _ in names]
        first = f"tcp/127.0.0.1:{ports[0]}"
        nodes = []
        for name, port in zip(names, ports, strict=True):
            args = ["--listen", f"tcp/127.0.0.1:{port}", "--cluster-key", key, "--node-name", name, *extra_args]
            if port != ports[0]:
                args += ["--bootstrap-peers", first]
            env = (envs or {}).get(name)  # only when asked: many callers' spawns take no env
            nodes.append(spawn(name, extra_args=args) if env is None else spawn(name, extra_args=args, env=dict(env)))
        try:
            for node in nodes:
                node.wait_ready()
        except PortTaken:
            for node in nodes:
                node.stop()
            if attempt + 1 == PORT_TRIES:
                raise
            continue
        return nodes
    raise AssertionError("unreachable")


def cluster(node: NodeProcess) -> dict:
    return node.get("/v1/cluster").json()


def node_id(node: NodeProcess) -> str:
    return node.get("/node_id").json()["nodeId"]


def agreed(nodes: list[NodeProcess], *, members: int | None = None) -> dict | None:
    """The common view if every node reports the same master, session, hash and index
    (and, optionally, that many alive members); None otherwise."""
    views = [cluster(n) for n in nodes]
    first = views[0]
    keys = ("masterNodeId", "sessionId", "stateHash", "lastEventIdx")
    if first["masterNodeId"] is None or any(tuple(v[k] for k in keys) != tuple(first[k] for k in keys) for v in views):
        return None
    if members is not None:
        alive = [n for n in first["nodes"] if n["alive"]]
        if len(first["nodes"]) != members or len(alive) != members:
            return None
    return first


def wait_agreed(nodes: list[NodeProcess], *, members: int | None = None, timeout_s: float = CONVERGE_DEADLINE_S,
                what: str = "agreement") -> dict:
    try:
        return wait_for(lambda: agreed(nodes, members=members), timeout_s=timeout_s, interval_s=0.25, what=what)
    except TimeoutError as exc:
        views = []
        for n in nodes:
            try:
                views.append(cluster(n))
            except Exception as err:
                views.append(repr(err))
        logs = "\n".join(f"--- {n.data_dir.name} ---\n{n.log()[-4000:]}" for n in nodes)
        raise AssertionError(f"{exc}\nviews: {views}\n{logs}") from None
