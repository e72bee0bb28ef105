"""Sessions over HTTP on a real node, runner and llama.cpp engine (tiny GGUF): a session
decodes exactly what a plain completion of its transcript decodes, re-uses its KV (cached
tokens), snapshots to the data dir, restores on a fresh runner with identical tokens, and
is refused (typed) once its model was re-placed."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, place, wait_instance_ready
from tests.nodeproc import NodeProcess, wait_for

pytestmark = pytest.mark.timeout(300)

PREFIX = "Once upon a time, in a quiet harbour town, there lived an old sailor who"
GREEDY = {"maxTokens": 8, "temperature": 0}


def post(node: NodeProcess, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(node.url + path, json=body or {}, timeout=60)


def get(node: NodeProcess, path: str) -> httpx.Response:
    """As the session's owner (the keyless loopback client that opened it)."""
    return httpx.get(node.url + path, timeout=30)


def completion(node: NodeProcess, prompt: str) -> str:
    response = post(node, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def streamed(node: NodeProcess, session_id: str) -> tuple[str, dict]:
    with httpx.stream("POST", f"{node.url}/v1/sessions/{session_id}/decode", json={**GREEDY, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "done", events
    return "".join(e["text"] for e in events if e["type"] == "token"), events[-1]


@pytest.fixture
def one_node(spawn_node):
    (node,) = start_linked(spawn_node, ["solo"])
    wait_agreed([node], members=1)
    return node


def test_a_session_decodes_like_plain_completions_snapshots_restores_and_is_fenced(one_node):
    node = one_node
    instance = place(node)
    wait_instance_ready(node, instance["instanceId"])

    opened = post(node, "/v1/sessions", {"model": MODEL, "prefix": PREFIX})
    assert opened.status_code == 200, opened.text
    session = opened.json()
    sid = session["id"]
    assert session["model"] == MODEL and session["instanceId"] == instance["instanceId"]
    assert session["contextTokens"] > 0 and session["tokensHeld"] > 5 and session["coldBudgetBytes"] > 0

    first = post(node, f"/v1/sessions/{sid}/decode", GREEDY).json()
    assert first["text"] == completion(node, PREFIX)
    transcript = PREFIX + first["text"]

    assert post(node, f"/v1/sessions/{sid}/prefill", {"text": " The sea"}).status_code == 200
    transcript += " The sea"
    text, _done = streamed(node, sid)
    assert text == completion(node, transcript)
    transcript += text
    # The plain completion of the same transcript ran in between; the session's next call
    # still finds its prefix cached.
    second = post(node, f"/v1/sessions/{sid}/decode", GREEDY).json()
    assert second["usage"]["cachedTokens"] > 0
    assert second["text"] == completion(node, transcript)
    transcript += second["text"]

    # Another principal (the node's API key, not the loopback client) cannot see it.
    stranger = node.get(f"/v1/sessions/{sid}")
    assert stranger.status_code == 404 and stranger.json()["error"]["code"] == "session_not_found"
    assert get(node, f"/v1/sessions/{sid}").json()["tokensHeld"] > session["tokensHeld"]

    branch = post(node, f"/v1/sessions/{sid}/branch").json()
    assert branch["id"] != sid and branch["transcriptChars"] == len(transcript)

    snap = post(node, f"/v1/sessions/{sid}/snapshot").json()
    assert snap["stored"] is True and snap["transcript"] == transcript
    assert (node.data_dir / "sessions" / f"{sid}.json").is_file()

    expected = completion(node, transcript)

    # kill -9 of the runner: the node restarts it for the same instance. The session's KV
    # died with it; the next call re-evaluates the transcript (nothing cached) and decodes
    # exactly what the lost KV would have, never on stale KV.
    instance_view = node.get(f"/instance/{instance['instanceId']}").json()
    runner_id = next(iter(instance_view["runners"]))
    pid = node.get("/v1/diagnostics/node").json()["worker"]["runners"][runner_id]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: node.get("/v1/diagnostics/node").json()["worker"]["runners"][runner_id]["pid"] != pid
             and node.get(f"/instance/{instance['instanceId']}").json()["runners"][runner_id]["state"]
             in ("Ready", "Running"), timeout_s=120, what="runner restarted")
    after_crash = post(node, f"/v1/sessions/{branch['id']}/decode", GREEDY)
    assert after_crash.status_code == 200, after_crash.text
    assert after_crash.json()["text"] == expected and after_crash.json()["usage"]["cachedTokens"] == 0

    # The model is re-placed: a fresh runner, another instance. The old session is refused,
    # typed, and its snapshot continues it there with the tokens the old one would decode.
    assert httpx.delete(f"{node.url}/instance/{instance['instanceId']}", timeout=10).status_code == 200
    wait_for(lambda: node.get(f"/instance/{instance['instanceId']}").status_code == 404, timeout_s=60,
             what="instance deleted")
    gone = get(node, f"/v1/sessions/{sid}")
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "session_lost", gone.text
    again = place(node)
    wait_instance_ready(node, again["instanceId"])
    fenced = post(node, f"/v1/sessions/{sid}/decode", GREEDY)
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "session_fenced", fenced.text

    restored = post(node, "/v1/sessions/restore", {"snapshotId": sid})
    assert restored.status_code == 200, restored.text
    rid = restored.json()["id"]
    assert restored.json()["instanceId"] == again["instanceId"]
    assert post(node, f"/v1/sessions/{rid}/decode", GREEDY).json()["text"] == expected

    # From the document itself (what another node of the same model would be posted).
    other = post(node, "/v1/sessions/restore", {"snapshot": {k: v for k, v in snap.items() if k != "stored"}})
    assert other.status_code == 200, other.text

    assert httpx.delete(f"{node.url}/v1/sessions/{rid}", timeout=10).status_code == 200
    missing = get(node, f"/v1/sessions/{rid}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
    bad = post(node, "/v1/sessions/restore", {"snapshotId": "../etc/passwd"})
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "snapshot_not_found"
