"""A runner that keeps crashing on one node, real processes on loopback: the worker's crash
breaker gives up on it after CRASH_BREAKER_MAX_CRASHES kills, reports it Failed with `gaveUp`,
and the master re-places the single-node instance on the other node (the failing node
stamped as an exclusion), where it serves a chat with no operator action.

Deterministic: each kill waits for the runner to be Ready again and for the worker's own
count of runner failures to move, never for time to pass."""

from __future__ import annotations

import signal

import httpx
import psutil
import pytest

from skulk.worker.runner.breaker import CRASH_BREAKER_MAX_CRASHES
from tests.cluster.harness import node_id
from tests.cluster.test_placement_repair import GGUF_MODEL, all_logs, place_gguf_on, start
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(420)

READY_DEADLINE_S = 120.0
"""Hang guard for a tiny GGUF runner to start and load on a loaded 2-core machine."""


def runner_failures(node: NodeProcess) -> int:
    return node.get("/v1/diagnostics/node").json()["worker"]["runnerFailures"]


def runner_state(node: NodeProcess, runner_id: str) -> str | None:
    return node.get("/state").json()["runners"].get(runner_id, {}).get("state")


def kill_runners(node: NodeProcess) -> None:
    for child in psutil.Process(node.proc.pid).children(recursive=True):
        child.send_signal(signal.SIGKILL)


def test_a_runner_that_keeps_crashing_is_replaced_on_the_other_node_and_serves(spawn_node) -> None:
    flaky, steady = start(spawn_node, [("flaky", {}), ("steady", {})])
    flaky_id, steady_id = node_id(flaky), node_id(steady)
    first = place_gguf_on([flaky, steady], flaky_id)
    runner_id = first.shards[0].runner_id

    try:
        for crash in range(CRASH_BREAKER_MAX_CRASHES):
            wait_for(lambda crash=crash: runner_state(flaky, runner_id) in ("Ready", "Running")
                     and runner_failures(flaky) == crash, timeout_s=READY_DEADLINE_S, interval_s=0.25,
                     what=f"the runner Ready before kill {crash + 1}")
            kill_runners(flaky)
            wait_for(lambda crash=crash: runner_failures(flaky) == crash + 1, timeout_s=30, interval_s=0.1,
                     what=f"the worker to see crash {crash + 1}")

        def replaced() -> dict | None:
            state = steady.get("/state").json()
            mine = [i for i in state["instances"].values() if i["modelId"] == GGUF_MODEL]
            if first.instance_id in state["instances"] or len(mine) != 1:
                return None
            runners = [state["runners"].get(s["runnerId"], {}).get("state") for s in mine[0]["shards"]]
            return mine[0] if all(r in ("Ready", "Running") for r in runners) else None

        inst = wait_for(replaced, timeout_s=READY_DEADLINE_S, interval_s=0.5, what="the instance re-placed and Ready")
    except TimeoutError as exc:
        state = steady.get("/state").json()
        raise AssertionError(f"{exc}\ninstances {state['instances']}\nrunners {state['runners']}\n"
                             f"repairs {state.get('repairFailures')}\n{all_logs([flaky, steady])[-6000:]}") from None
    assert [s["nodeId"] for s in inst["shards"]] == [steady_id]
    assert inst["repairHop"] == 1 and flaky_id in inst["excludedNodes"]
    assert runner_id in flaky.get("/v1/diagnostics/node").json()["worker"]["givenUp"]
    assert all(node.proc.poll() is None for node in (flaky, steady))  # no node was lost
    reply = httpx.post(flaky.url + "/v1/chat/completions", timeout=60, json={
        "model": GGUF_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
