"""Routers in one process talking over explicit loopback endpoints with multicast off."""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
import zenoh

from skulk.routing import kick as zenoh_kick
from skulk.routing.cluster_key import derive_wire_key
from skulk.routing.constants import NETWORK_VERSION, topic_key
from skulk.routing.hearing import DEAF_AFTER_S, HEARD_AGAIN_GRACE_S, REFRESH_AFTER_DEAF_S
from skulk.routing.presence import PresenceChange
from skulk.routing.router import (
    TRANSPORT_KEEP_ALIVES_PER_LEASE,
    TRANSPORT_LEASE_MS,
    Router,
    RouterClosed,
    RouterOpenError,
    SubscriptionClosed,
    TopicMisuse,
    build_zenoh_config,
)
from tests.routing.routing_testkit import (
    CHUNKS,
    PING,
    PONG,
    READINGS,
    Chunk,
    Ping,
    Reading,
    RouterFactory,
    eventually,
    next_item,
    publish_until,
    publish_until_received,
    receive_until,
    wait_connected,
)

pytestmark = pytest.mark.timeout(30)


@pytest_asyncio.fixture
async def routers():
    factory = RouterFactory()
    try:
        yield factory
    finally:
        await factory.aclose()


async def poll_with(action, done, *, timeout_s: float = 5.0, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    attempt = 0
    while not done():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        attempt += 1
        action(attempt)
        await asyncio.sleep(0.02)


async def pair(routers: RouterFactory, **kwargs):
    a, a_endpoint = await routers.open("node-a")
    b, _ = await routers.open("node-b", connect=[a_endpoint], **kwargs)
    return a, b, a_endpoint


async def test_control_round_trip_is_typed_and_names_the_sender(routers) -> None:
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING)
    probe = await publish_until_received(b, PING, lambda n: Ping(nonce=-n), sub)
    assert probe.sender == "node-b" and probe.session == b.session_id

    for nonce in range(1, 21):
        await b.publish(PING, Ping(nonce=nonce, sent_by="node-b"))
    got = [await next_item(sub) for _ in range(20)]
    assert [item.message for item in got] == [Ping(nonce=n, sent_by="node-b") for n in range(1, 21)]
    assert all(isinstance(item.message, Ping) for item in got)


async def test_telemetry_round_trip_keeps_latest_value_per_sender_and_reading(routers) -> None:
    a, b, _ = await pair(routers)
    sub = a.subscribe(READINGS, maxsize=8)
    await publish_until_received(b, READINGS, lambda n: Reading(node_name="probe", value=-n), sub)
    while sub.qsize():
        sub.get_nowait()

    for value in range(1, 11):
        await b.publish(READINGS, Reading(node_name="gpu0", value=float(value)))
    # nobody consumes meanwhile: ten readings of one kind from one sender collapse to the latest
    await eventually(lambda: a.diagnostics()["topics"][READINGS.name]["replaced"] >= 9, what="readings to replace each other")
    assert sub.qsize() == 1
    latest = sub.get_nowait()
    assert (latest.sender, latest.message) == ("node-b", Reading(node_name="gpu0", value=10.0))


async def test_node_addressed_data_reaches_only_the_addressed_node(routers) -> None:
    a, a_endpoint = await routers.open("node-a")
    b, _ = await routers.open("node-b", connect=[a_endpoint])
    c, _ = await routers.open("node-c", connect=[a_endpoint])
    sub_b = b.subscribe(CHUNKS)
    sub_c = c.subscribe(CHUNKS)
    assert sub_b.key_expr == topic_key(CHUNKS.name, "node-b")

    await publish_until_received(a, CHUNKS, lambda n: Chunk(stream_id="for-b", index=n), sub_b, to_node="node-b")
    for index in range(5):
        await a.publish(CHUNKS, Chunk(stream_id="for-b", index=100 + index), to_node="node-b")
    # then one for C, on the same plane from the same publisher: once it arrives, anything
    # misrouted to C would have arrived before it
    first_for_c = await publish_until_received(a, CHUNKS, lambda n: Chunk(stream_id="for-c", index=n), sub_c, to_node="node-c")
    assert first_for_c.message.stream_id == "for-c"
    assert [(await next_item(sub_b)).message.index for _ in range(5)] == [100, 101, 102, 103, 104]
    while sub_c.qsize():
        assert sub_c.get_nowait().message.stream_id == "for-c"
    assert c.diagnostics()["rejected"]["auth"] == 0


async def test_wrong_key_node_is_counted_and_never_heard_while_good_peers_still_are(routers) -> None:
    a, a_endpoint = await routers.open("node-a")
    good, _ = await routers.open("node-good", connect=[a_endpoint])
    rogue, _ = await routers.open("node-rogue", connect=[a_endpoint], cluster_key="some-other-cluster")
    sub_a = a.subscribe(PING)
    sub_rogue = rogue.subscribe(PING)

    await wait_connected(a, peers=2)
    await publish_until(
        rogue, PING, lambda n: Ping(nonce=n, sent_by="rogue"), lambda: a.rejected_count("auth", "node-rogue") > 0,
        what="node-a rejects the rogue's envelopes",
    )
    assert sub_a.qsize() == 0

    # the good peer is still heard afterwards, and only the good peer
    item = await publish_until_received(good, PING, lambda n: Ping(nonce=n, sent_by="good"), sub_a)
    assert item.sender == "node-good"
    await rogue.publish(PING, Ping(nonce=10_000, sent_by="rogue"))
    await good.publish(PING, Ping(nonce=10_001, sent_by="good"))
    assert (await receive_until(sub_a, lambda i: i.message.nonce >= 10_000)).message.nonce == 10_001

    # the rogue side hears nothing either: it counts the good nodes' envelopes as auth failures
    await eventually(lambda: rogue.rejected_count("auth", "node-good") > 0, what="rogue to reject good traffic")
    while sub_rogue.qsize():
        assert sub_rogue.get_nowait().sender == "node-rogue"  # only its own, delivered locally
    diagnostics = a.diagnostics()
    assert diagnostics["rejected"]["auth"] >= 1
    assert diagnostics["rejectedByPeer"]["node-rogue"]["auth"] >= 1
    assert "node-good" not in diagnostics["rejectedByPeer"]


async def test_raw_garbage_on_the_key_is_counted_malformed_and_reception_continues(routers) -> None:
    a, b, a_endpoint = await pair(routers)
    sub = a.subscribe(PING)
    await publish_until_received(b, PING, lambda n: Ping(nonce=n), sub)

    config = zenoh.Config.from_json5(json.dumps({
        "mode": "peer", "connect": {"endpoints": [a_endpoint]},
        "scouting": {"multicast": {"enabled": False}},
    }))
    raw = await asyncio.to_thread(zenoh.open, config)
    try:
        garbage = [b"", b"\x00", b"not an envelope at all", bytes(range(256)), b"\xe1" + b"\xff" * 40]

        def put_garbage(_: int) -> None:
            for blob in garbage:
                raw.put(topic_key(PING.name), blob)

        await poll_with(put_garbage, lambda: a.rejected_count("malformed") >= len(garbage) - 1, what="garbage counted")
    finally:
        await asyncio.to_thread(raw.close)

    await b.publish(PING, Ping(nonce=4242))
    await receive_until(sub, lambda item: item.message.nonce == 4242)
    assert a.diagnostics()["rejectedByPeer"]["unknown"]["malformed"] >= 1


async def test_valid_envelope_with_a_payload_of_the_wrong_type_is_counted_invalid(routers) -> None:
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING)
    await publish_until_received(b, PING, lambda n: Ping(nonce=n), sub)
    # another build whose test_ping topic carries a different type: authentic, but not a Ping
    stale_ping = type(PING)(PING.name, PING.plane, Reading)
    await publish_until(
        b, stale_ping, lambda n: Reading(node_name="x", value=float(n)), lambda: a.rejected_count("invalid", "node-b") > 0,
        what="the stale type is counted invalid",
    )
    await b.publish(PING, Ping(nonce=77))
    await receive_until(sub, lambda item: item.message.nonce == 77)


async def test_full_control_queue_drops_newest_and_counts(routers, caplog) -> None:
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING, maxsize=3)
    await publish_until_received(b, PING, lambda n: Ping(nonce=-n), sub)
    while sub.qsize():
        sub.get_nowait()

    for nonce in range(10):
        await b.publish(PING, Ping(nonce=nonce))
    await eventually(lambda: sub.dropped >= 7, what="7 drops")
    assert [sub.get_nowait().message.nonce for _ in range(3)] == [0, 1, 2]
    stats = a.diagnostics()["topics"][PING.name]
    assert (stats["capacity"], stats["dropped"]) == (3, 7)
    assert sum("is full" in record.getMessage() for record in caplog.records) == 1


async def test_presence_appears_and_disappears_when_the_other_router_closes(routers) -> None:
    a, b, _ = await pair(routers)
    a.declare_presence()
    watch = a.watch_presence()
    assert await next_item(watch) == PresenceChange("node-a", True)

    b.declare_presence()
    b.declare_presence()  # idempotent
    assert await next_item(watch) == ("node-b", True)
    assert watch.alive() == {"node-a", "node-b"}
    await wait_connected(a)

    await b.close()
    assert await next_item(watch) == ("node-b", False)
    assert watch.alive() == {"node-a"}
    await eventually(lambda: a.connected_peer_count() == 0, what="peer count to drop")


async def test_late_watcher_sees_existing_members(routers) -> None:
    a, b, _ = await pair(routers)
    b.declare_presence()
    first = a.watch_presence()
    assert await next_item(first) == ("node-b", True)
    second = a.watch_presence()  # history: already-present tokens are reported
    assert await next_item(second) == ("node-b", True)


async def test_presence_of_another_cluster_or_build_is_counted_not_reported(routers) -> None:
    a, a_endpoint = await routers.open("node-a")
    rogue, _ = await routers.open("node-rogue", connect=[a_endpoint], cluster_key="other-cluster")
    old, _ = await routers.open("node-old", connect=[a_endpoint], network_version="skulk-net-0")
    good, _ = await routers.open("node-good", connect=[a_endpoint])
    watch = a.watch_presence()
    for router in (rogue, old, good):
        router.declare_presence()
    assert await next_item(watch) == ("node-good", True)
    await eventually(lambda: a.rejected_count("auth", "node-rogue") >= 1, what="rogue token rejected")
    await eventually(lambda: a.rejected_count("version", "node-old") >= 1, what="old build's token counted")
    assert watch.alive() == {"node-good"}


async def test_publish_refuses_wrong_type_and_wrong_addressing(routers) -> None:
    a, _ = await routers.open("node-a")
    with pytest.raises(TopicMisuse):
        await a.publish(PING, Reading(node_name="x", value=1.0))
    with pytest.raises(TopicMisuse):
        await a.publish(PING, {"nonce": 1})  # type: ignore[arg-type]
    with pytest.raises(TopicMisuse):
        await a.publish(PING, Ping(nonce=1), to_node="node-b")
    with pytest.raises(TopicMisuse):
        await a.publish(CHUNKS, Chunk(stream_id="s", index=0))
    with pytest.raises(TopicMisuse):
        await a.publish(CHUNKS, Chunk(stream_id="s", index=0), to_node="bad/node")


async def test_own_messages_are_delivered_locally(routers) -> None:
    a, _ = await routers.open("node-a", listen=False)
    sub = a.subscribe(CHUNKS)
    await a.publish(CHUNKS, Chunk(stream_id="self", index=1), to_node="node-a")
    item = await next_item(sub)
    assert (item.sender, item.message) == ("node-a", Chunk(stream_id="self", index=1))


async def test_a_subscriber_that_declines_its_own_messages_still_hears_its_peers(routers) -> None:
    a, b, _ = await pair(routers)
    others_only = a.subscribe(PING, own=False)
    everything = a.subscribe(PING)
    await publish_until_received(b, PING, lambda n: Ping(nonce=-n), others_only)
    await a.publish(PING, Ping(nonce=1, sent_by="node-a"))
    mine = await receive_until(everything, lambda item: item.message.nonce == 1)
    assert mine.sender == "node-a"  # echoed to the subscriber that wants it
    await b.publish(PING, Ping(nonce=2, sent_by="node-b"))
    senders = []
    while not senders or senders[-1] != ("node-b", 2):
        item = await next_item(others_only)
        senders.append((item.sender, item.message.nonce))
    assert all(sender == "node-b" for sender, _ in senders), senders


async def test_close_is_idempotent_ends_subscriptions_and_refuses_use(routers) -> None:
    a, _b, _ = await pair(routers)
    sub = a.subscribe(PONG)
    watch = a.watch_presence()
    consumer = asyncio.create_task(sub.get())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(a.close(), a.close())
    await a.close()
    assert loop.time() - started < 5
    with pytest.raises(SubscriptionClosed):
        await asyncio.wait_for(consumer, 5)

    async def drain() -> list:
        return [change async for change in watch]

    await asyncio.wait_for(drain(), 5)  # iteration ends instead of hanging
    with pytest.raises(RouterClosed):
        await a.publish(PONG, Ping(nonce=1))
    with pytest.raises(RouterClosed):
        a.subscribe(PONG)
    assert a.connected_peer_count() == 0
    assert a.diagnostics()["closed"] is True


async def test_diagnostics_shape(routers) -> None:
    a, _b, _ = await pair(routers)
    a.subscribe(PING, maxsize=5)
    a.subscribe(PING, maxsize=7)
    a.subscribe(READINGS)
    a.watch_presence()
    await wait_connected(a)
    diagnostics = a.diagnostics()
    assert diagnostics["nodeId"] == "node-a"
    assert diagnostics["connectedPeers"] == 1
    assert diagnostics["topics"][PING.name] == {
        "plane": "control", "subscriptions": 2, "depth": 0, "capacity": 12, "dropped": 0, "replaced": 0, "delivered": 0,
        "receiveErrors": 0,
    }
    assert diagnostics["topics"][READINGS.name]["capacity"] == 256
    assert set(diagnostics["rejected"]) == {"malformed", "auth", "replay", "decode", "invalid", "version", "unproven",
                                            "oversize"}
    json.dumps(diagnostics)  # goes straight into /v1/diagnostics/node


async def test_closing_one_subscription_under_traffic_leaves_the_others_receiving(routers) -> None:
    a, b, _ = await pair(routers)
    doomed = a.subscribe(PING, maxsize=4)
    survivor = a.subscribe(PING)
    await publish_until_received(b, PING, lambda n: Ping(nonce=n), survivor)

    async def flood() -> None:
        for nonce in range(1000, 1500):
            await b.publish(PING, Ping(nonce=nonce))

    flooding = asyncio.create_task(flood())
    await eventually(lambda: doomed.dropped > 0, what="the small queue to overflow")
    doomed.close()
    doomed.close()
    await flooding
    assert (await receive_until(survivor, lambda item: item.message.nonce == 1499)).sender == "node-b"
    assert PING.name in a.diagnostics()["topics"]
    assert a.diagnostics()["topics"][PING.name]["subscriptions"] == 1


async def test_listening_on_a_taken_port_is_a_typed_open_error(routers) -> None:
    _, a_endpoint = await routers.open("node-a")
    with pytest.raises(RouterOpenError) as info:
        await Router.open(
            node_id="node-b", session_id="s1", listen=[a_endpoint], connect=[], multicast=False,
            wire_key=derive_wire_key("k", NETWORK_VERSION),
        )
    assert info.value.listen == [a_endpoint]


@pytest.mark.parametrize("bad", [{"node_id": "a/b"}, {"session_id": "*"}, {"wire_key": b"short"}])
async def test_open_refuses_ids_that_break_key_expressions_and_bad_keys(bad) -> None:
    arguments = {
        "node_id": "node-a", "session_id": "s1", "listen": [], "connect": [], "multicast": False,
        "wire_key": derive_wire_key("k", NETWORK_VERSION), **bad,
    }
    with pytest.raises(ValueError):
        await Router.open(**arguments)


async def test_nodes_sharing_one_bootstrap_peer_mesh_through_gossip(routers) -> None:
    a, a_endpoint = await routers.open("node-a")
    b, _ = await routers.open("node-b", connect=[a_endpoint])
    c, _ = await routers.open("node-c", connect=[a_endpoint])
    await wait_connected(b, c, peers=2)
    await a.close()  # the bootstrap peer leaves; b and c keep a direct link
    sub_c = c.subscribe(PING)
    item = await publish_until_received(b, PING, lambda n: Ping(nonce=n), sub_c)
    assert item.sender == "node-b"


def test_the_transport_lease_survives_the_reassembly_bound() -> None:
    """Both live under transport.link: the bound once replaced the whole block, so nodes ran
    with zenoh's 10 s default lease and a frozen node was only noticed by its missed presence
    challenges (4-6 s) instead of within the lease."""
    config = zenoh.Config.from_json5(json.dumps(build_zenoh_config(
        node_id="n", listen=[], connect=[], multicast=False, max_message_bytes=4096)))
    assert json.loads(config.get_json("transport/link/tx/lease")) == TRANSPORT_LEASE_MS
    assert json.loads(config.get_json("transport/link/tx/keep_alive")) == TRANSPORT_KEEP_ALIVES_PER_LEASE
    assert json.loads(config.get_json("transport/link/rx/max_message_size")) == 4096


async def test_refreshed_declarations_keep_receiving_and_answering_presence_proofs(routers) -> None:
    """The deaf node's cure (hearing.py): every subscription and the proof queryable are
    declared anew; messages keep arriving and presence stays proven across it."""
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING)
    a.declare_presence()
    watch = b.watch_presence()
    assert await next_item(watch) == ("node-a", True)
    await publish_until_received(b, PING, lambda n: Ping(nonce=-n), sub)
    a._refresh_declarations()
    while sub.qsize():
        sub.get_nowait()
    probe = await publish_until_received(b, PING, lambda n: Ping(nonce=1000 + n), sub)
    assert probe.sender == "node-b"
    before = b._verifier.kept
    b._tick_proofs()  # not due yet: force a fresh challenge of a's refreshed queryable
    with b._verifier_lock:
        for session in b._verifier._sessions.values():
            session.proven_at = -1e9
    b._tick_proofs()
    await eventually(lambda: all(s.pending is None and s.proven_at is not None and s.proven_at > 0
                                 for s in b._verifier._sessions.values()), what="a fresh proof after the refresh")
    assert watch.alive() >= {"node-a"} and b._verifier.kept == before
    assert a.diagnostics()["hearing"]["refreshes"] == 1


async def test_a_node_that_hears_none_of_its_present_peers_is_deaf_until_it_hears_again(routers) -> None:
    """b holds a presence token, speaks once, then nothing: a is deaf after DEAF_AFTER_S (and
    refreshes its declarations once); once b speaks again, a hears after the grace."""
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING)
    a.declare_presence()
    b.declare_presence()
    watch = a.watch_presence()
    while (await next_item(watch)) != ("node-b", True):
        pass
    await publish_until_received(b, PING, lambda n: Ping(nonce=-n), sub)
    await eventually(lambda: a.deaf_for_s() > 0, timeout_s=DEAF_AFTER_S + 5, what="a deaf")
    await eventually(lambda: a.diagnostics()["hearing"]["refreshes"] == 1, timeout_s=REFRESH_AFTER_DEAF_S + 5,
                     what="one refresh")
    assert a.diagnostics()["hearing"]["deafEpisodes"] == 1
    if zenoh_kick.supported():  # deaf past KICK_AFTER_DEAF_S with nothing heard: zenoh's threads were kicked
        await eventually(lambda: a.diagnostics()["hearing"]["kicks"] >= 1, timeout_s=5, what="a kick")
    stop = asyncio.Event()

    async def keep_talking() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await b.publish(PING, Ping(nonce=n))
            await asyncio.sleep(0.2)

    talker = asyncio.create_task(keep_talking())
    try:
        await eventually(lambda: a.deaf_for_s() == 0, timeout_s=HEARD_AGAIN_GRACE_S + 5, what="a hearing again")
    finally:
        stop.set()
        await talker
    assert sub.qsize() > 0 and a.diagnostics()["hearing"]["refreshes"] == 1


@pytest.mark.skipif(not zenoh_kick.supported(), reason="the kick is Linux only (a no-op elsewhere)")
async def test_kicking_zenohs_threads_leaves_a_live_router_delivering_everything(routers) -> None:
    """The deaf node's kick (kick.py) interrupts every zenoh thread's wait with a handled
    signal; zenoh must take that as a spurious wake-up: every message still arrives, in order."""
    a, b, _ = await pair(routers)
    sub = a.subscribe(PING)
    await publish_until_received(b, PING, lambda n: Ping(nonce=-n), sub)
    while sub.qsize():
        sub.get_nowait()
    assert zenoh_kick.install()
    threads = zenoh_kick.zenoh_thread_ids()
    assert threads, "zenoh's runtime threads are named rx-/tx-/net-/acc-/app-"
    signalled = []
    for nonce in range(1, 41):
        signalled.append(zenoh_kick.kick())
        await b.publish(PING, Ping(nonce=nonce, sent_by="node-b"))
    got = [await next_item(sub) for _ in range(40)]
    assert [item.message for item in got] == [Ping(nonce=n, sent_by="node-b") for n in range(1, 41)]
    assert all(count > 0 for count in signalled)
    a._kick_zenoh("a test")  # the router's own path: counted in diagnostics
    await b.publish(PING, Ping(nonce=41, sent_by="node-b"))
    assert (await next_item(sub)).message == Ping(nonce=41, sent_by="node-b")
    assert a.diagnostics()["hearing"]["kicks"] == 1
