"""Serve a model end to end: place it, then talk to it with the official OpenAI SDK.

Real node processes, a real runner subprocess, the real llama.cpp engine on the generated
tiny GGUF model. The tiny model never chooses to stop, so every completion runs to
max_tokens: that makes the usage counts exact and checkable.
"""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for

MODEL = "local/tiny-llama-gguf"


def place(node: NodeProcess, **body) -> dict:
    """Place MODEL; a cluster whose members agree may not have gossiped every node's resources
    yet, which the API answers with a typed 503 `placement_info_pending` ("retry shortly"):
    retry that one refusal, as a client would, until the resources are in."""

    def attempt() -> httpx.Response | None:
        response = httpx.post(node.url + "/place_instance", json={"modelId": MODEL, **body}, timeout=10)
        pending = response.status_code == 503 and response.json()["error"]["code"] == "placement_info_pending"
        return None if pending else response

    response = wait_for(attempt, timeout_s=60, interval_s=0.5, what="node resources gossiped for placement")
    assert response.status_code == 200, response.text
    return response.json()


def wait_instance_ready(node: NodeProcess, instance_id: str, timeout_s: float = 120) -> dict:
    def ready():
        response = node.get(f"/instance/{instance_id}")
        if response.status_code != 200:
            return None
        body = response.json()
        states = [r["state"] for r in body["runners"].values()]
        failed = [r for r in body["runners"].values() if r["state"] == "Failed"]
        assert not failed, f"runner failed: {failed}\n{node.log()[-3000:]}"
        return body if states and all(s in ("Ready", "Running") for s in states) else None

    return wait_for(ready, timeout_s=timeout_s, what=f"instance {instance_id} ready")


def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def one_node(spawn_node):
    (node,) = start_linked(spawn_node, ["solo"])
    wait_agreed([node], members=1)
    return node


def test_openai_sdk_chat_stream_and_non_stream_on_one_node(one_node):
    instance = place(one_node)
    wait_instance_ready(one_node, instance["instanceId"])
    sdk = client(one_node)

    models = [m.id for m in sdk.models.list().data]
    assert MODEL in models

    reply = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about the weather."}], max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content

    # Streaming gives the same greedy text, token by token, with usage in the final chunk.
    chunks = list(sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about the weather."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 6  # really streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = [c.usage for c in chunks if c.usage]
    assert usage and usage[-1].completion_tokens == 12 and usage[-1].prompt_tokens == reply.usage.prompt_tokens


def test_unplaced_model_is_404_naming_the_fix_and_bad_params_are_400(one_node):
    sdk = client(one_node)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert "place_instance" in str(missing.value)
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=7)
    # Nothing was dispatched for either: no task exists.
    assert one_node.get("/state").json()["tasks"] == {}


def test_request_at_one_node_is_served_by_a_runner_on_another(spawn_node):
    a, b = start_linked(spawn_node, ["a", "b"])
    wait_agreed([a, b], members=2)
    instance = place(a, excludedNodes=[node_id(a)])
    body = wait_instance_ready(a, instance["instanceId"])
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}
    reply = client(a).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0,
    )
    assert reply.usage.completion_tokens == 8 and reply.choices[0].message.content
    stream = client(a).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0, stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reply.choices[0].message.content
    # The output crossed the data plane: b's worker sent frames to a remote owner.
    worker = b.get("/v1/diagnostics/node").json()["worker"]
    assert worker["framesRemote"] > 0


def test_kill_9_of_the_runner_mid_stream_ends_the_stream_with_an_error(one_node):
    instance = place(one_node)
    body = wait_instance_ready(one_node, instance["instanceId"])
    runner_id = next(iter(body["runners"]))
    sdk = client(one_node)
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story."}], max_tokens=1500,
        temperature=0, stream=True,
    )
    received = 0
    killed = False
    with pytest.raises(openai.APIError) as failure:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
            if received == 3 and not killed:
                pid = one_node.get("/v1/diagnostics/node").json()["worker"]["runners"][runner_id]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed = True
    assert killed, "the stream ended before the runner could be killed"
    # The node ended the stream with the crash; the client's 60 s read timeout is only a
    # hang guard (a stream left open would end as a timeout, not as this error).
    assert not isinstance(failure.value, openai.APITimeoutError), "hung: the stream stayed open after the crash"
    assert "crash" in str(failure.value).lower() or "exit" in str(failure.value).lower()
    # The breaker counted it and the node restarts the runner (one crash is forgiven).
    wait_for(lambda: one_node.get(f"/instance/{instance['instanceId']}").json()["runners"][runner_id]["state"]
             in ("Ready", "Running"), timeout_s=120, what="runner restarted")


def test_impossible_placement_is_400_with_per_node_arithmetic(spawn_node, tmp_path):
    data_dir = tmp_path / "solo"
    cards = data_dir / "custom_model_cards"
    cards.mkdir(parents=True)
    (cards / "local--huge-model.toml").write_text(HUGE_CARD)
    node = spawn_node("solo", data_dir=data_dir, extra_args=["--cluster-key", "k"]).wait_ready()
    wait_for(lambda: node.get("/v1/cluster").json()["nodes"], timeout_s=30, what="membership")
    wait_for(lambda: node.get("/state").json()["nodeResources"], timeout_s=30, what="resources")
    response = httpx.post(node.url + "/place_instance", json={"modelId": "local/huge-model"}, timeout=10)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "GB" in message and "available" in message and node_id(node) in message
    assert node.get("/state").json()["instances"] == {}


HUGE_CARD = """
model_id = "local/huge-model"
name = "Huge model (test)"
family = "llama"
num_layers = 80
hidden_size = 8192
num_attention_heads = 64
num_key_value_heads = 8
head_dim = 128
vocab_size = 128256
context_length = 8192
storage_size_bytes = 400_000_000_000
quantization = "Q4_K_M"
tasks = ["TextGeneration"]
capabilities = ["text"]
gguf_file = "huge.gguf"
source = "local-path"
local_path = "/nonexistent/huge"

[placement]
compatible_backends = ["llama_cpp", "llama_cpp-cpu"]
backend_preference = ["llama_cpp-cpu"]
"""


def test_a_stopping_node_starts_no_runner(one_node):
    """SIGTERM stops the node's runners; the worker's plan must not start them again while they
    stop (it used to: a runner spawned after the SIGTERM, then killed with the process)."""
    wait_instance_ready(one_node, place(one_node)["instanceId"])
    one_node.stop()
    log = one_node.log()
    assert "stopping: received SIGTERM" in log
    after = log.split("stopping: received SIGTERM", 1)[1]
    assert "spawned, pid" not in after, after[-3000:]
    assert "shut down (runner exited" in after  # its runner stopped, and only that one
