"""Prompts are not kept: after chats whose model runs on another node, neither node's
`/state` nor anything in either data dir (event log, archives, snapshots) holds the prompt
or the answer, while the answers themselves are right. Before this change the master wrote
`TaskCreated.params.messages` into its event log and `/state` returned them."""

from __future__ import annotations

import stat

import httpx
import zstandard

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.nodeproc import NodeProcess, wait_for

MODEL = "local/tiny-llama-gguf"
MARKER = "zebra-quartz-marker-7731"
DEADLINE_S = 90.0


def _place_on(api: NodeProcess, excluded: str) -> None:
    def placed():
        response = api.get("/instance/previews", params={"modelId": MODEL})
        if response.status_code != 200:
            return None
        reply = httpx.post(api.url + "/place_instance", timeout=10,
                           json={"modelId": MODEL, "excludedNodes": [excluded]})
        return reply.json()["instanceId"] if reply.status_code == 200 else None

    wait_for(placed, timeout_s=DEADLINE_S, interval_s=0.5, what="placement on the other node")


def _chat(api: NodeProcess, stream: bool) -> str:
    body = {"model": MODEL, "max_tokens": 6, "stream": stream, "temperature": 0,
            "messages": [{"role": "system", "content": f"system {MARKER}"},
                         {"role": "user", "content": f"hello {MARKER}"}]}

    def answered():
        reply = httpx.post(api.url + "/v1/chat/completions", json=body, timeout=60)
        return reply if reply.status_code == 200 else None

    reply = wait_for(answered, timeout_s=DEADLINE_S, interval_s=0.5, what="a chat answer")
    if not stream:
        return reply.json()["choices"][0]["message"]["content"]
    assert "data: [DONE]" in reply.text
    return reply.text


def _file_bytes(path) -> bytes:
    data = path.read_bytes()
    if data[:4] == b"\x28\xb5\x2f\xfd":  # a zstd archive of the event log
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            return reader.read()
    return data


def test_prompts_never_reach_state_or_disk(spawn_node):
    api, server = start_linked(spawn_node, ["api", "server"])
    wait_agreed([api, server], members=2)
    _place_on(api, excluded=node_id(api))
    answer = _chat(api, stream=False)
    assert answer  # the text reached the runner on the other node, over the data plane
    streamed = _chat(api, stream=True)
    assert '"content"' in streamed
    # The answer text is written nowhere either (only the markers are searched: tiny-model
    # output is short, common tokens that could appear by chance in binary files).
    for node in (api, server):
        state = node.get("/state").text
        assert MARKER not in state, "the prompt is in /state"
        for path in node.data_dir.rglob("*"):
            if path.is_file():
                assert MARKER.encode() not in _file_bytes(path), f"the prompt is in {path}"
        assert stat.S_IMODE(node.data_dir.stat().st_mode) == 0o700
        event_files = [p for p in (node.data_dir / "event_log").rglob("*") if p.is_file()]
        assert event_files and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in event_files)
    # The serving node's worker received the text through its task-input store.
    inputs = server.get("/v1/diagnostics/node").json()["worker"]["taskInputs"]
    assert inputs["received"] >= 2, inputs
