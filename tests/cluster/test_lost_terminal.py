"""A completed request whose terminal frame is lost on the way to its owning API, real
processes on loopback: the runner's node drops every terminal it sends to a remote owner
(the test knob SKULK_TEST_WORKER_DROPS_TERMINALS, standing in for a full send queue or a lost
publish). The request enters on the other node, so its output crosses the data plane; once
State shows the task Complete, the owning API ends the stream typed (`terminal_lost`, after
TERMINAL_GRACE_S) instead of holding the client for the 30-minute idle lease. No timing is
asserted: the client's own timeout is only a hang guard far below the idle lease."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster.harness import node_id
from tests.cluster.test_placement_repair import GGUF_MODEL, all_logs, place_gguf_on, start
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

CLIENT_HANG_GUARD_S = 120.0
"""Far below the 30-minute idle lease the stream would wait for without the fix."""


def test_a_lost_terminal_ends_the_request_typed_once_the_task_is_complete(spawn_node) -> None:
    entry, server = start(spawn_node, [("entry", {}), ("server", {"SKULK_TEST_WORKER_DROPS_TERMINALS": "1"})])
    server_id = node_id(server)
    runner_id = place_gguf_on([entry, server], server_id).shards[0].runner_id
    try:
        wait_for(lambda: entry.get("/state").json()["runners"].get(runner_id, {}).get("state") in ("Ready", "Running"),
                 timeout_s=120, interval_s=0.5, what="the runner Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{all_logs([entry, server])[-6000:]}") from None

    reply = httpx.post(entry.url + "/v1/chat/completions", timeout=CLIENT_HANG_GUARD_S, json={
        "model": GGUF_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert reply.status_code == 502, reply.text
    error = reply.json()["error"]
    assert error["code"] == "terminal_lost", error
    assert "completed in the cluster" in error["message"]
    assert "dropped the terminal" in server.log()
    assert entry.get("/v1/diagnostics/node").json()["streams"]["expiredTerminal"] == 1
