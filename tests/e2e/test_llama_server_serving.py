"""Many requests at once through a real node: the tiny GGUF placed on the llama_server
engine (the managed CPU llama-server), eight OpenAI SDK streams decoding together, and a
node killed with SIGKILL leaving no llama-server behind."""

from __future__ import annotations

import signal
import threading

import openai
import psutil
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready
from tests.llama_server_kit import require_llama_server
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

STREAMS = 8
TOKENS = 100


def llama_servers() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "llama-server":
            found.append(process)
    return found


def test_eight_sdk_streams_progress_together_on_one_instance(spawn_node):
    binary = require_llama_server()
    env = {"SKULK_LLAMA_SERVER_BIN": str(binary), "SKULK_LLAMA_SERVER_PARALLEL": str(STREAMS)}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["served"])
    wait_agreed([node], members=1)
    instance = place(node)
    body = wait_instance_ready(node, instance["instanceId"])
    assert [s["backend"] for s in body["shards"]] == ["llama_server-cpu"]
    servers_before = {p.pid for p in llama_servers()}

    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def stream(index: int) -> None:
        try:
            chunks = client(node).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Story {index}"}], max_tokens=TOKENS,
                temperature=0, stream=True)
            first = True
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content and first:
                    with lock:
                        events.append(("first", index))
                    first = False
                if chunk.choices and chunk.choices[0].finish_reason:
                    with lock:
                        events.append(("finish", index))
                    assert chunk.choices[0].finish_reason == "length"
        except BaseException as exc:  # reported below, with the node's log
            failures.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not failures, f"{failures}\n{node.log()[-3000:]}"
    first_finish = next(i for i, (kind, _) in enumerate(events) if kind == "finish")
    assert {i for kind, i in events[:first_finish] if kind == "first"} == set(range(STREAMS)), events
    assert sum(1 for kind, _ in events if kind == "finish") == STREAMS

    # kill -9 of the node: its runner follows within a second, and the runner's server with it.
    ours = [p for p in llama_servers() if p.pid in servers_before]
    assert ours
    node.signal(signal.SIGKILL)
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ours),
             timeout_s=20, what="llama-server gone after the node was killed")


def test_an_invalid_slot_setting_fails_the_runner_with_the_reason(spawn_node):
    env = {"SKULK_LLAMA_SERVER_BIN": str(require_llama_server()), "SKULK_LLAMA_SERVER_PARALLEL": "0"}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, env=env, extra_args=extra_args), ["badslots"])
    wait_agreed([node], members=1)
    instance = place(node)
    assert [s["backend"] for s in instance["preview"]["shards"]] == ["llama_server-cpu"], instance

    def failed():
        runners = node.get(f"/instance/{instance['instanceId']}").json()["runners"].values()
        return next((r for r in runners if r["state"] == "Failed"), None)

    try:
        runner = wait_for(failed, timeout_s=120, what="runner failed")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{node.get('/instance/' + instance['instanceId']).text}\n"
                             f"{node.log()[-4000:]}") from None
    assert "SKULK_LLAMA_SERVER_PARALLEL" in str(runner)
    with pytest.raises(openai.APIError):
        client(node).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
