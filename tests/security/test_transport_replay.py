"""Attacks on the transport by a peer without the cluster key: replayed presence, and bulk.

Presence tokens are zenoh liveliness tokens: key expressions with no payload, visible to
every zenoh peer on the network. Before (parent commit): a peer without the key that copied
a node's token key and re-declared it kept that node "alive" for every watcher after the
node itself was gone (measured: still reported alive after the victim closed, until the
replaying peer left), so an old master's replayed token kept the cluster from electing a new
one.

Now a token counts only while its session answers a fresh challenge with a MAC under the
presence key (`skulk.routing.presence`): a replayed token never answers, so the node is
reported gone as soon as its own token goes, or at the next re-proof.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
import zenoh

from skulk.routing.constants import KEY_ROOT, PRESENCE_SEGMENT, topic_key
from skulk.routing.envelope import MAX_ENVELOPE_OVERHEAD_BYTES
from skulk.routing.router import TopicMisuse, build_zenoh_config
from skulk.routing.topics import TOPICS, Plane, Topic, largest_payload_bytes
from tests.routing.routing_testkit import (
    Ping,
    RouterFactory,
    eventually,
    next_item,
    publish_until_received,
    receive_until,
    wait_connected,
)

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture
async def routers():
    factory = RouterFactory()
    try:
        yield factory
    finally:
        await factory.aclose()


async def raw_peer(endpoint: str) -> zenoh.Session:
    """A zenoh peer that holds no cluster key: all it can do is copy what it sees."""
    config = zenoh.Config.from_json5(json.dumps({
        "mode": "peer", "connect": {"endpoints": [endpoint]}, "scouting": {"multicast": {"enabled": False}},
    }))
    return await asyncio.to_thread(zenoh.open, config)


async def copied_token_keys(session: zenoh.Session, node_id: str) -> list[str]:
    """The presence token keys of `node_id` that the peer can observe."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while loop.time() < deadline:
        replies = await asyncio.to_thread(
            lambda: list(session.liveliness().get(f"{KEY_ROOT}/*/{PRESENCE_SEGMENT}/**", timeout=1.0)))
        keys = [str(reply.ok.key_expr) for reply in replies if reply.ok is not None]
        keys = [key for key in keys if f"/{node_id}/" in key]
        if keys:
            return keys
        await asyncio.sleep(0.05)
    raise AssertionError(f"the raw peer never saw {node_id}'s presence token")


async def test_a_replayed_presence_token_does_not_keep_a_dead_node_alive(routers):
    watcher, endpoint = await routers.open("node-watcher")
    master, _ = await routers.open("node-old-master", connect=[endpoint])
    watch = watcher.watch_presence()
    master.declare_presence()
    assert await next_item(watch) == ("node-old-master", True)
    await wait_connected(watcher)

    attacker = await raw_peer(endpoint)
    replayed = []
    try:
        for key in await copied_token_keys(attacker, "node-old-master"):
            replayed.append(attacker.liveliness().declare_token(key))
        await master.close()  # the old master dies; its copied token lives on at the attacker
        await eventually(lambda: "node-old-master" not in watch.alive(),
                         timeout_s=15, what="the dead master to be reported gone despite the replayed token")
        assert watcher.rejected_count("unproven") >= 1  # the replay is counted as what it is

        # A watcher that starts now never reports it either.
        late = watcher.watch_presence()
        await eventually(lambda: watcher.rejected_count("unproven") >= 2, timeout_s=15, what="a second failed proof")
        assert "node-old-master" not in late.alive()
        queued = []
        while True:
            try:
                queued.append(late.get_nowait())
            except asyncio.QueueEmpty:
                break
        assert ("node-old-master", True) not in queued
    finally:
        for token in replayed:
            token.undeclare()
        await asyncio.to_thread(attacker.close)


async def test_live_nodes_are_still_reported_promptly(routers):
    a, endpoint = await routers.open("node-a")
    b, _ = await routers.open("node-b", connect=[endpoint])
    watch = a.watch_presence()
    b.declare_presence()
    assert await next_item(watch, timeout_s=10) == ("node-b", True)
    await b.close()
    assert await next_item(watch, timeout_s=10) == ("node-b", False)


# -- Unauthenticated bulk is refused before it is buffered ------------------------------------

SMALL = Topic("test_small", Plane.CONTROL, Ping, max_payload_bytes=1024)


async def test_an_oversized_sample_is_refused_unread_and_counted(routers):
    """Before: any sample on a topic's key was copied out of zenoh and decrypted in full
    (an "auth" or "malformed" reject after the work), whatever its size, from anyone.
    Now: a sample over the topic's bound is refused on arrival ("oversize"), before it is
    copied, decrypted or buffered, and the topic keeps working."""
    a, endpoint = await routers.open("node-a")
    b, _ = await routers.open("node-b", connect=[endpoint])
    sub = a.subscribe(SMALL)
    await publish_until_received(b, SMALL, lambda n: Ping(nonce=n), sub)
    attacker = await raw_peer(endpoint)
    try:
        blob = b"\xe1" + b"\x00" * (256 * 1024)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while a.rejected_count("oversize") == 0:
            assert loop.time() < deadline, "the oversized sample was never refused"
            attacker.put(topic_key(SMALL.name), blob)
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(attacker.close)
    assert a.rejected_count("auth") == 0 and a.rejected_count("malformed") == 0  # never opened
    queued = []
    while sub.qsize():
        queued.append(sub.get_nowait())
    assert all(item.sender == "node-b" for item in queued)  # nothing of the attacker's got in
    await b.publish(SMALL, Ping(nonce=99))
    await receive_until(sub, lambda item: item.message.nonce == 99)


async def test_a_publish_over_the_topics_bound_is_refused_typed(routers):
    a, _ = await routers.open("node-a")
    with pytest.raises(TopicMisuse, match="over the topic's bound"):
        await a.publish(SMALL, Ping(nonce=1, sent_by="x" * 4096))


@pytest.mark.parametrize("topic", list(TOPICS), ids=lambda t: t.name)
def test_every_cluster_topic_has_a_payload_bound(topic):
    assert 0 < topic.max_payload_bytes <= largest_payload_bytes(TOPICS)


def test_zenoh_never_reassembles_more_than_the_largest_topic_admits():
    config = build_zenoh_config(node_id="n", listen=[], connect=[], multicast=False,
                                max_message_bytes=largest_payload_bytes(TOPICS) + MAX_ENVELOPE_OVERHEAD_BYTES)
    assert config["transport"]["link"]["rx"]["max_message_size"] < 1024**3  # zenoh's own default is 1 GiB
