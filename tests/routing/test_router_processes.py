"""Two routers in two processes: typed round trip, telemetry, presence join and leave."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from skulk.routing.presence import PresenceChange
from tests.routing.routing_testkit import (
    PING,
    PONG,
    READINGS,
    Ping,
    RouterFactory,
    eventually,
    next_item,
    publish_until_received,
    receive_until,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
# Python start-up plus imports of zenoh and pydantic in the child.
CHILD_START_S = 10.0

pytestmark = pytest.mark.timeout(40)


@pytest_asyncio.fixture
async def routers():
    factory = RouterFactory()
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
def spawn_peer(tmp_path):
    processes: list[subprocess.Popen] = []

    def spawn(node_id: str, connect: str, cluster_key: str) -> subprocess.Popen:
        log_file = open(tmp_path / f"{node_id}.log", "wb")  # noqa: SIM115 -- a file, not a pipe: a chatty child never blocks
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.routing.routing_peer", "--node-id", node_id,
             "--connect", connect, "--cluster-key", cluster_key],
            cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT,
        )
        log_file.close()
        processes.append(process)
        return process

    yield spawn
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


async def test_peer_process_answers_and_its_departure_is_seen(routers, spawn_peer, tmp_path) -> None:
    a, a_endpoint = await routers.open("node-a", cluster_key="process-test-key")
    a.declare_presence()
    watch = a.watch_presence()
    pongs = a.subscribe(PONG)
    readings = a.subscribe(READINGS)
    assert await next_item(watch) == PresenceChange("node-a", True)

    child = spawn_peer("node-child", a_endpoint, "process-test-key")
    try:
        assert await next_item(watch, timeout_s=CHILD_START_S) == ("node-child", True)
    except TimeoutError:
        raise AssertionError((tmp_path / "node-child.log").read_text()) from None

    pong = await publish_until_received(a, PING, lambda n: Ping(nonce=n), pongs)
    assert (pong.sender, pong.message.sent_by) == ("node-child", "node-child")
    await a.publish(PING, Ping(nonce=1000))
    assert (await receive_until(pongs, lambda item: item.message.nonce == 1000)).sender == "node-child"
    reading = await receive_until(readings, lambda item: item.message.value == 1000.0)
    assert reading.sender == "node-child"

    await a.publish(PING, Ping(nonce=-1))
    assert await next_item(watch) == ("node-child", False)
    await eventually(lambda: child.poll() is not None, what="the child to exit")
    assert child.returncode == 0, (tmp_path / "node-child.log").read_text()
    assert a.diagnostics()["rejected"] == {reason: 0 for reason in a.diagnostics()["rejected"]}


async def test_peer_process_with_another_key_is_counted_and_never_a_member(routers, spawn_peer) -> None:
    a, a_endpoint = await routers.open("node-a", cluster_key="process-test-key")
    watch = a.watch_presence()
    pongs = a.subscribe(PONG)
    spawn_peer("node-stranger", a_endpoint, "another-key")
    await eventually(lambda: a.rejected_count("auth", "node-stranger") >= 1, timeout_s=CHILD_START_S,
                     what="the stranger's presence token to be rejected")
    # it never answers (it cannot read our pings) and never becomes a member
    await a.publish(PING, Ping(nonce=5))
    assert watch.alive() == frozenset()
    assert pongs.qsize() == 0
