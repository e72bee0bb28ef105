"""A traced request entered at node A (API only, no worker) and served on node B (the only
worker): one trace, gathered by either node, holds spans from both nodes in causal order,
and is valid Chrome trace-event JSON. Real node processes, a real runner, llama.cpp on the
tiny GGUF model (which never stops early: max_tokens decides the token count)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cluster.harness import node_id, wait_agreed
from tests.nodeproc import NodeProcess, free_port, wait_for
from tests.observe.serving_kit import chat, place_and_wait

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 40
GATHER_DEADLINE_S = 30.0


def set_tracing(node: NodeProcess, enabled: bool, everyone: list[NodeProcess]) -> None:
    assert httpx.put(node.url + "/v1/tracing", json={"enabled": enabled}, timeout=10).status_code == 202
    wait_for(lambda: all(n.get("/v1/tracing").json()["enabled"] is enabled for n in everyone), timeout_s=30,
             what=f"tracing {enabled} everywhere")


def check_chrome_trace(doc: dict) -> list[dict]:
    """Structural checks of the Chrome trace-event format (what Perfetto's JSON importer
    reads); returns the non-metadata events."""
    json.dumps(doc)  # plain JSON all the way down
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    events = []
    for event in doc["traceEvents"]:
        assert isinstance(event["name"], str) and isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert event["ph"] in ("X", "i", "M"), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "process_sort_index") and "args" in event
            continue
        assert isinstance(event["ts"], (int, float)) and event["ts"] > 0
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
        events.append(event)
    return events


def start_api_and_worker(spawn) -> tuple[NodeProcess, NodeProcess]:
    """Node A runs no worker (every request it takes is served elsewhere); node B serves."""
    port_a, port_b = free_port(), free_port()
    common = ["--cluster-key", "trace-test-key"]
    a = spawn("trace-a", extra_args=["--listen", f"tcp/127.0.0.1:{port_a}", "--node-name", "trace-a",
                                     "--no-worker", *common])
    b = spawn("trace-b", extra_args=["--listen", f"tcp/127.0.0.1:{port_b}", "--node-name", "trace-b",
                                     "--bootstrap-peers", f"tcp/127.0.0.1:{port_a}", *common])
    for node in (a, b):
        node.wait_ready()
    wait_agreed([a, b], members=2)
    return a, b


def names_by_node(events: list[dict], doc: dict) -> dict[str, list[dict]]:
    by_pid = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    out: dict[str, list[dict]] = {}
    for event in events:
        out.setdefault(event["args"]["node"], []).append(event)
        assert event["args"]["node"] in by_pid[event["pid"]]  # the process is named after its node
    return out


def first(events: list[dict], name: str) -> dict:
    return next(e for e in events if e["name"] == name)


def test_a_request_entered_at_a_and_served_on_b_yields_one_trace_from_both_nodes(spawn_node):
    a, b = start_api_and_worker(spawn_node)
    id_a, id_b = node_id(a), node_id(b)
    place_and_wait(a)
    set_tracing(a, True, [a, b])

    response = chat(a, MAX_TOKENS, stream=True)
    assert response.status_code == 200
    completion_id = next(json.loads(line[6:])["id"] for line in response.text.splitlines()
                         if line.startswith("data: {"))
    trace_id = completion_id.removeprefix("chatcmpl-")

    listing = httpx.get(a.url + "/v1/traces", timeout=GATHER_DEADLINE_S).json()
    assert [t["traceId"] for t in listing["traces"]] == [trace_id] and listing["traces"][0]["parts"] == 2

    def complete_trace():
        doc = httpx.get(a.url + f"/v1/traces/{trace_id}", timeout=GATHER_DEADLINE_S).json()
        return doc if {"api.stream_end", "runner.finish", "worker.forward"} <= {e["name"] for e in doc["traceEvents"]} \
            else None

    doc = wait_for(complete_trace, timeout_s=30, what="both nodes' parts of the trace")
    events = check_chrome_trace(doc)
    per_node = names_by_node(events, doc)
    assert set(per_node) == {id_a, id_b}
    api_names = {e["name"] for e in per_node[id_a]}
    assert {"api.receive", "api.placement_lookup", "api.submit", "api.wait_runner", "api.wait_first_token",
            "api.stream", "api.request", "api.stream_end"} <= api_names
    served = per_node[id_b]
    assert {"worker.dispatch", "runner.queue_wait", "runner.prefill", "runner.decode", "runner.finish",
            "worker.forward"} <= {e["name"] for e in served}
    decoded = sum(e["args"]["tokens"] for e in served if e["name"] == "runner.decode")
    # Every token after the first is one decode step, and the task ran once (a second
    # dispatch of a finished task would add its own decode spans).
    assert decoded == MAX_TOKENS - 1, [(e["name"], e["args"]) for e in served]
    assert [e["name"] for e in served].count("worker.dispatch") == 1
    assert first(served, "worker.forward")["args"]["path"] == "data-topic"

    # Causal order across the two nodes (one machine, one clock).
    bound = first(events, "master.bind_task")  # recorded by whichever node is master
    order = [first(per_node[id_a], "api.receive"), first(per_node[id_a], "api.submit"), bound,
             first(served, "worker.dispatch"),
             first(served, "runner.queue_wait"), first(served, "runner.prefill"), first(served, "runner.decode"),
             first(served, "runner.finish"), first(per_node[id_a], "api.stream_end")]
    starts = [e["ts"] for e in order]
    assert starts == sorted(starts), [(e["name"], e["ts"]) for e in order]
    request = first(per_node[id_a], "api.request")
    assert request["ts"] <= first(served, "runner.prefill")["ts"] and \
        request["ts"] + request["dur"] >= first(served, "runner.finish")["ts"]

    # Either node gathers the same trace; each holds (and saved) its own part.
    from_b = httpx.get(b.url + f"/v1/traces/{trace_id}", timeout=GATHER_DEADLINE_S).json()
    assert len(check_chrome_trace(from_b)) == len(events)
    assert (a.data_dir / "cache" / "traces" / f"{trace_id}.json").exists()
    assert (b.data_dir / "cache" / "traces" / f"{trace_id}.json").exists()
    assert httpx.get(a.url + "/v1/traces/no-such-trace", timeout=GATHER_DEADLINE_S).status_code == 404

    # Tracing off: the next request leaves no trace anywhere.
    set_tracing(b, False, [a, b])
    assert chat(a, 3).status_code == 200
    listing = httpx.get(b.url + "/v1/traces", timeout=GATHER_DEADLINE_S).json()
    assert [t["traceId"] for t in listing["traces"]] == [trace_id]
