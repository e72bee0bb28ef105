"""Capability providers across two real nodes: the provider extension is installed only on
node B (a test entry point on its PYTHONPATH); every call enters node A over HTTP and
crosses the fabric to B and back (docs/PROVIDERS.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.extensions import provider_kit
from tests.nodeproc import PORT_TRIES, NodeProcess, free_port, wait_for

pytestmark = pytest.mark.timeout(300)

SRC = Path(__file__).resolve().parents[2] / "src"
CALL_DEADLINE_S = 30.0
"""A hang guard for one HTTP call, not a performance bound."""


def install_kit(root: Path) -> Path:
    """A dir that, on PYTHONPATH, makes the provider kit an installed `skulk.extensions` entry point."""
    root.mkdir()
    shutil.copy(provider_kit.__file__, root / "provider_kit.py")
    dist = root / "skulk_provider_kit-1.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: skulk-provider-kit\nVersion: 1.0.0\n")
    (dist / "entry_points.txt").write_text("[skulk.extensions]\nprovider-kit = provider_kit:extension\n")
    return root


def sse_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events, event = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((event, json.loads(line[len("data: ") :])))
    return events


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Nodes A and B, shared by this module's tests (starting nodes is the slow part)."""
    tmp = tmp_path_factory.mktemp("providers")
    kit = install_kit(tmp / "kit")
    markers = tmp / "markers"
    markers.mkdir()
    started: list[NodeProcess] = []

    def spawn(name: str, *, extra_args=(), env=None) -> NodeProcess:
        node = NodeProcess(
            data_dir=tmp / name,
            api_port=free_port(),
            extra_args=list(extra_args),
            env=dict(env or {}),
            port_tries=PORT_TRIES,
        )
        started.append(node)
        return node.start()

    envs = {"a": {"PYTHONPATH": str(SRC)}, "b": {"PYTHONPATH": f"{kit}:{SRC}", provider_kit.MARKERS_ENV: str(markers)}}
    try:
        a, b = start_linked(spawn, ["a", "b"], envs=envs)
        wait_agreed([a, b], members=2)
        yield a, b, node_id(b), markers
    finally:
        for node in started:
            node.stop()


def listing(a: NodeProcess, b_id: str) -> dict[str, dict[str, Any]]:
    def found():
        body = a.get("/v1/capabilities").json()
        return {row["id"]: row for row in body["data"] if row["node"] == b_id} or None

    return wait_for(found, timeout_s=30, what="node B's capabilities listed by node A")


def call(a: NodeProcess, row: dict[str, Any], payload: Any, **extra: Any) -> httpx.Response:
    body = {"node": row["node"], "version": row["version"], "revision": row["revision"], "input": payload, **extra}
    return httpx.post(f"{a.url}/v1/capabilities/{row['id']}/call", json=body, headers=a.auth, timeout=CALL_DEADLINE_S)


def test_unary_and_server_streaming_calls_cross_from_node_a_to_node_b(two_nodes):
    a, _, b_id, _ = two_nodes
    rows = listing(a, b_id)
    assert rows["echo"]["ioMode"] == "unary" and rows["count"]["ioMode"] == "server_streaming"
    assert len(rows["echo"]["revision"]) == 64 and rows["echo"]["inputSchema"]["required"] == ["text"]
    served_by_a = {row["id"] for row in a.get("/v1/capabilities").json()["data"] if row["node"] != b_id}
    assert served_by_a == {"vad", "stt", "stt.realtime", "tts"}  # A has no extension: only the first-party speech providers

    reply = call(a, rows["echo"], {"text": "hello from A"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"node": b_id, "id": "echo", "version": "1.0.0", "output": {"text": "hello from A"}}

    body = {"node": b_id, "version": "1.0.0", "revision": rows["count"]["revision"], "input": {"n": 4}}
    with httpx.stream(
        "POST", f"{a.url}/v1/capabilities/count/call", json=body, headers=a.auth, timeout=CALL_DEADLINE_S
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events == [*(("chunk", {"seq": i, "output": {"i": i}}) for i in range(4)), ("completed", {"chunks": 4})]


def test_schema_violations_and_a_deadline_end_with_typed_errors(two_nodes):
    a, b, b_id, _ = two_nodes
    rows = listing(a, b_id)
    before = b.get("/v1/diagnostics/node").json()["capabilities"]["serving"]

    bad_input = call(a, rows["echo"], {"text": 7})
    assert bad_input.status_code == 400, bad_input.text
    assert bad_input.json()["errorKind"] == "invalid_request" and bad_input.json()["code"] == "input_invalid"
    serving = b.get("/v1/diagnostics/node").json()["capabilities"]["serving"]
    assert serving["opened"] == before["opened"]  # refused before the provider ran

    bad_output = call(a, rows["bad-output"], {"text": "x"})
    assert bad_output.status_code == 502 and bad_output.json()["code"] == "output_invalid", bad_output.text

    late = call(a, rows["hang"], {"text": "x"}, timeoutS=1)
    assert late.status_code == 504 and late.json()["code"] == "deadline_exceeded", late.text

    stale = call(a, {**rows["echo"], "revision": "0" * 64}, {"text": "x"})
    assert stale.status_code == 409 and stale.json()["code"] == "revision_mismatch", stale.text

    stranger = call(a, {**rows["echo"], "node": "no-such-node"}, {"text": "x"})
    assert stranger.status_code == 502 and stranger.json()["code"] == "node_unreachable", stranger.text

    streaming_input = call(a, rows["sum"], None)
    assert streaming_input.status_code == 400 and streaming_input.json()["code"] == "mode_unsupported"


def test_a_client_leaving_a_stream_cancels_it_and_the_handler_is_closed_on_node_b(two_nodes):
    a, b, b_id, markers = two_nodes
    rows = listing(a, b_id)
    body = {"node": b_id, "version": "1.0.0", "revision": rows["wait-stream"]["revision"], "input": {"n": 1}}
    with httpx.stream(
        "POST", f"{a.url}/v1/capabilities/wait-stream/call", json=body, headers=a.auth, timeout=CALL_DEADLINE_S
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines) == "event: chunk"
    # the connection is closed: A cancels the call at B, whose handler's `finally` runs
    wait_for(lambda: (markers / "wait-stream").is_file(), timeout_s=30, what="the handler's finally on node B")
    serving = wait_for(
        lambda: (s := b.get("/v1/diagnostics/node").json()["capabilities"]["serving"])["cancelled"] and s,
        timeout_s=30,
        what="the cancelled call counted on node B",
    )
    assert serving["cancelled"] == 1 and serving["active"] == 0


def test_a_malformed_chunk_ends_the_stream_with_a_synthetic_failure(two_nodes):
    a, _, b_id, markers = two_nodes
    rows = listing(a, b_id)
    body = {"node": b_id, "version": "1.0.0", "revision": rows["malformed"]["revision"], "input": {"n": 1}}
    with httpx.stream(
        "POST", f"{a.url}/v1/capabilities/malformed/call", json=body, headers=a.auth, timeout=CALL_DEADLINE_S
    ) as response:
        events = sse_events(response)
    assert events[0] == ("chunk", {"seq": 0, "output": {"i": 0}})
    assert [name for name, _ in events[1:]] == ["failed"]
    assert events[1][1]["code"] == "malformed_chunk" and events[1][1]["node"] == b_id
    assert (markers / "malformed").is_file()  # closed before the failure went out


def socket_call(a: NodeProcess, row: dict[str, Any], frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open the call on node A's WebSocket, send `frames`, and read to the terminal."""
    uri = f"ws://127.0.0.1:{a.api_port}/v1/capabilities/{row['id']}/socket"
    with connect(uri, additional_headers=a.auth, open_timeout=CALL_DEADLINE_S) as socket:
        socket.send(json.dumps({"node": row["node"], "version": row["version"], "revision": row["revision"]}))
        received = [json.loads(socket.recv(timeout=CALL_DEADLINE_S))]
        for frame in frames:
            socket.send(json.dumps(frame))
        while received[-1]["type"] not in ("completed", "failed", "cancelled"):
            received.append(json.loads(socket.recv(timeout=CALL_DEADLINE_S)))
    return received


def test_client_streaming_and_bidi_cross_nodes_on_the_websocket(two_nodes):
    a, _, b_id, _ = two_nodes
    rows = listing(a, b_id)
    summed = socket_call(
        a, rows["sum"], [{"type": "input", "input": {"n": n}} for n in (1, 2, 3)] + [{"type": "complete"}]
    )
    assert summed == [
        {"type": "started", "ioMode": "client_streaming"},
        {"type": "chunk", "seq": 0, "output": {"total": 6}},
        {"type": "completed", "chunks": 1},
    ]

    shouted = socket_call(
        a, rows["upper"], [{"type": "input", "input": {"text": t}} for t in ("a", "b")] + [{"type": "complete"}]
    )
    assert [f.get("output") for f in shouted[1:-1]] == [{"text": "A"}, {"text": "B"}, {"text": "<done>"}]
    assert shouted[-1] == {"type": "completed", "chunks": 3}

    refused = socket_call(a, rows["sum"], [{"type": "input", "input": {"n": "three"}}])
    assert refused[-1]["type"] == "failed" and refused[-1]["code"] == "input_invalid", refused
