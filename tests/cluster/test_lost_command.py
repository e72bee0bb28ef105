"""A request whose command the master never received is still served (the chaos suite's CI
hang): the API publishes it again until its task is logged.

The race, as CI met it: clients that got `MasterFailover` retried at once, and their new
`GenerateText` went out while the new master's command subscription was not up yet; pub/sub
keeps no history, so the commands were gone and both requests sent no byte for 60 s (the
first-frame deadline is two minutes). Here the master is told to ignore the first
`GenerateText` it receives (`SKULK_TEST_MASTER_DROPS_GENERATIONS`), which loses a command
deterministically: the streamed chat must still complete, the node must say it published
the command again, and the model must have run it once.
"""

from __future__ import annotations

import json

import httpx

from tests.e2e.test_openai_serving import MODEL, wait_instance_ready
from tests.nodeproc import free_port, wait_for

CLIENT_TIMEOUT_S = 60.0
"""Under the first-frame deadline (120 s): a lost command shows as a client timeout."""


def test_a_lost_generation_command_is_published_again_and_served(spawn_node):
    listen = free_port()
    node = spawn_node("solo", env={"SKULK_TEST_MASTER_DROPS_GENERATIONS": "1"},
                      extra_args=["--listen", f"tcp/127.0.0.1:{listen}", "--cluster-key", "lost-command-key",
                                  "--node-name", "solo"]).wait_ready()
    placed = wait_for(lambda: (r := httpx.post(node.url + "/place_instance", json={"modelId": MODEL}, timeout=10))
                      .status_code == 200 and r.json(), timeout_s=60, interval_s=0.5, what="the placement")
    wait_instance_ready(node, placed["instanceId"])

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
            "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=CLIENT_TIMEOUT_S) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    assert not [e for e in events if "error" in e], events
    assert events and events[-1]["choices"][0]["finish_reason"], events

    # The resender forgets a command on its next one-second tick after the stream started:
    # wait for that tick (observed state), never assume it already ran.
    diagnostics = wait_for(lambda: (d := node.get("/v1/diagnostics/node").json())["commandResends"]["tracked"] == 0
                           and d, timeout_s=30, interval_s=0.2, what="the command no longer tracked")
    assert diagnostics["commandResends"]["resent"] >= 1, diagnostics["commandResends"]
    assert "test knob SKULK_TEST_MASTER_DROPS_GENERATIONS: ignoring command" in node.log()
    # Bound once, however many copies reached the master: a second task would have sent a
    # second StreamStarted (a protocol violation) or frames after the end (late frames).
    streams = diagnostics["streams"]
    assert (streams["opened"], streams["completed"], streams["protocolViolations"], streams["droppedLateFrames"]) == (
        1, 1, 0, 0), streams
