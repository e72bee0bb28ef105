"""Field telemetry from a real node to a local receiver: a node that opted in through its
skulk.yaml sends a batch after a generation, holding the allowed fields and nothing of the
prompt, the output, the node's id or name, its address or its API key; a node where
SKULK_TELEMETRY_DISABLE=1 sends nothing and says why.

Real node processes, a real runner, the real llama.cpp engine on the tiny GGUF model, and a
plain `http.server` on 127.0.0.1 as the ingest.
"""

from __future__ import annotations

import json
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from skulk.shared.hardware_class import is_hardware_class
from tests.cluster.harness import start_linked, wait_agreed
from tests.nodeproc import wait_for
from tests.observe.serving_kit import MODEL, chat, place_and_wait

pytestmark = pytest.mark.timeout(480)

BATCH_DEADLINE_S = 30.0
"""Hang guard for a batch to reach the receiver: the node flushes every second."""

PROMPT = "hello there"  # what serving_kit.chat sends


class Receiver:
    """The local ingest: records every POSTed JSON body, answers 202."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.raw: list[bytes] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                received.raw.append(body)
                received.bodies.append(json.loads(body))
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/field-samples"


@contextmanager
def receiver() -> Iterator[Receiver]:
    ingest = Receiver()
    thread = threading.Thread(target=ingest.server.serve_forever, name="ingest", daemon=True)
    thread.start()
    try:
        yield ingest
    finally:
        ingest.server.shutdown()
        ingest.server.server_close()
        thread.join(timeout=5)


def opted_in(spawn_node, tmp_path, name: str, endpoint: str, key: str, env: dict[str, str] | None = None):
    """A single-node cluster whose skulk.yaml opts in, flushing every second to `endpoint`."""
    data_dir = tmp_path / name
    data_dir.mkdir()
    (data_dir / "skulk.yaml").write_text(
        f"# opted in for the test\ntelemetry:\n  enabled: true\n  endpoint: {endpoint}\n  flush_seconds: 1\n")
    (node,) = start_linked(lambda n, **kw: spawn_node(n, env=env, **kw), [name], key=key)
    wait_agreed([node], members=1)
    place_and_wait(node)
    return node


def generate(node) -> str:
    response = chat(node, 8)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_an_opted_in_node_sends_counts_and_never_text(spawn_node, tmp_path):
    with receiver() as vetoed_ingest, receiver() as ingest:
        # First the node whose environment forbids telemetry, so the other node's batch
        # arriving later is the gate: many of its flush ticks have passed by then.
        vetoed = opted_in(spawn_node, tmp_path, "vetoed-fox", vetoed_ingest.url, "key-one",
                          env={"SKULK_TELEMETRY_DISABLE": "1"})
        generate(vetoed)
        status = vetoed.get("/v1/telemetry").json()
        assert status["enabled"] is False and status["disabledByEnv"] is True and status["consent"] is True
        preview = vetoed.get("/v1/telemetry/preview").json()
        assert preview["enabled"] is False and preview["disabledByEnv"] is True
        assert preview["batch"]["samples"] == [] and preview["batch"]["installId"] is None
        refused = httpx.put(vetoed.url + "/v1/telemetry", json={"enabled": True}, timeout=10)
        assert refused.status_code == 409 and refused.json()["code"] == "telemetry_disabled_by_env"

        node = opted_in(spawn_node, tmp_path, "field-fox", ingest.url, "key-two")
        output = generate(node)
        batch = wait_for(lambda: next((b for b in ingest.bodies if any(
            s["kind"] == "generation" for s in b["samples"])), None), timeout_s=BATCH_DEADLINE_S, interval_s=0.1,
            what="a telemetry batch with a generation")

        assert vetoed_ingest.bodies == []
        assert not (vetoed.data_dir / "telemetry_install_id").exists()
        assert vetoed.get("/v1/telemetry").json()["counters"]["sentBatches"] == 0

    install_id_file = node.data_dir / "telemetry_install_id"
    assert batch["installId"] == install_id_file.read_text().strip()
    assert stat.S_IMODE(install_id_file.stat().st_mode) == 0o600
    assert set(batch) == {"schemaVersion", "installId", "skulkVersion", "samples", "dropped"}
    assert batch["schemaVersion"] == 1 and batch["dropped"] == 0
    (sample,) = [s for s in batch["samples"] if s["kind"] == "generation"]
    assert set(sample) == {"kind", "model", "hardware", "outcome", "failure", "ttftMs", "decodeTokensPerS",
                           "promptTokens", "completionTokens", "cachedTokens"}
    assert sample["model"] == MODEL and sample["outcome"] == "completed" and sample["failure"] is None
    (hardware,) = sample["hardware"]
    assert is_hardware_class(hardware) and hardware != "unknown" and re.search(r"-\d+gb$", hardware)
    assert sample["completionTokens"] == 8 and sample["promptTokens"] > 0 and sample["ttftMs"] >= 0
    assert sample["decodeTokensPerS"] > 0

    sent = b"".join(ingest.raw).decode()
    node_id = node.get("/node_id").json()["nodeId"]
    for secret in (PROMPT, node_id, "field-fox", "127.0.0.1", node.api_key, str(node.data_dir)):
        assert secret and secret not in sent, secret
    if len(output.strip()) >= 6:  # a longer output cannot appear in the JSON by chance
        assert output not in sent

    status = node.get("/v1/telemetry").json()
    assert status["enabled"] and status["installId"] == batch["installId"]
    assert status["counters"]["sentBatches"] >= 1 and status["counters"]["failedSends"] == 0
