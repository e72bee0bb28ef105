"""A request's input crosses the data plane in chunks, acknowledged: the built-in tiny VLM
(`local/tiny-vlm-gguf`, served by the bundled llama-server) placed on node B, asked through
node A with the official OpenAI SDK about an image whose params are larger than one chunk.
The answer comes back, node A's relay counts the chunks it sent and B's ack, node B's
assembler counts the chunks it reassembled. With node A told (the test knob
`SKULK_TEST_API_DROPS_INPUT_CHUNKS`) never to send a transfer's third chunk, a larger image's
transfer is lost on every try and the client gets the typed `InputTransferLost` (a 503),
while two-chunk inputs still pass and the model goes on serving."""

from __future__ import annotations

import base64
import io
import random

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from PIL import Image

from skulk.shared.input_transfer import CHUNK_BYTES, MAX_SEND_TRIES
from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.test_openai_serving import wait_instance_ready
from tests.llama_server_kit import require_bundled_server
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(420)

MODEL = "local/tiny-vlm-gguf"


def noise_png(side: int, seed: int) -> bytes:
    """Random pixels: PNG cannot compress them, so the file is about 3 bytes a pixel."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), random.Random(seed).randbytes(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


def ask(sdk: openai.OpenAI, image: bytes) -> ChatCompletion:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return sdk.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}])


def diagnostics(node) -> dict:
    return node.get("/v1/diagnostics/node").json()


TWO_CHUNKS = noise_png(560, 1)  # ~0.94 MB, 1.25 MB as base64: chunks 0 and 1
THREE_CHUNKS = noise_png(760, 2)  # ~1.73 MB, 2.3 MB as base64: chunks 0, 1 and 2


def test_an_image_larger_than_a_chunk_travels_acked_and_a_lost_transfer_is_typed(spawn_node, tmp_path):
    require_bundled_server()
    assert CHUNK_BYTES < len(base64.b64encode(TWO_CHUNKS)) < 2 * CHUNK_BYTES - 4096
    assert 2 * CHUNK_BYTES < len(base64.b64encode(THREE_CHUNKS)) < 3 * CHUNK_BYTES - 4096
    engine = {"SKULK_LLAMA_SERVER_BIN": "", "SKULK_BUNDLED_LLAMA_SERVER": "1",
              "SKULK_ENGINES_DIR": str(tmp_path / "no-engines-built")}
    a, b = start_linked(spawn_node, ["carry-a", "carry-b"],
                        envs={"carry-a": {**engine, "SKULK_TEST_API_DROPS_INPUT_CHUNKS": "2"}, "carry-b": engine})
    wait_agreed([a, b], members=2)

    def placed() -> httpx.Response | None:
        response = httpx.post(a.url + "/place_instance", json={"modelId": MODEL, "excludedNodes": [node_id(a)]},
                              timeout=10)
        return None if response.status_code == 503 else response

    response = wait_for(placed, timeout_s=90, interval_s=0.5, what="the VLM placed")
    assert isinstance(response, httpx.Response) and response.status_code == 200, response
    body = wait_instance_ready(a, response.json()["instanceId"], timeout_s=240)
    assert {s["nodeId"] for s in body["shards"]} == {node_id(b)}

    sdk = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    answered = ask(sdk, TWO_CHUNKS)
    assert answered.choices[0].message.content is not None
    assert answered.usage is not None and answered.usage.prompt_tokens > 0

    sent = diagnostics(a)["taskInputs"]
    assert (sent["sent"], sent["chunksSent"], sent["acked"], sent["resent"], sent["failed"]) == (1, 2, 1, 0, 0), sent
    assert sent["awaitingAck"] == 0 and sent["awaitingAckBytes"] == 0
    received = diagnostics(b)["inputTransfers"]
    assert (received["chunks"], received["completed"], received["refused"]) == (2, 1, 0), received
    assert received["inFlight"] == 0 and received["inFlightBytes"] == 0

    # Node A never sends chunk 2: every try of the three-chunk transfer stays incomplete.
    with pytest.raises(openai.InternalServerError) as lost:
        ask(sdk, THREE_CHUNKS)
    assert lost.value.status_code == 503 and lost.value.code == "InputTransferLost", lost.value.body
    sent = diagnostics(a)["taskInputs"]
    assert (sent["sent"], sent["acked"], sent["failed"]) == (2, 1, 1), sent
    assert sent["resent"] == MAX_SEND_TRIES - 1 and sent["chunksSent"] == 2 + 3 * MAX_SEND_TRIES
    assert sent["awaitingAck"] == 0
    wait_for(lambda: diagnostics(b)["inputTransfers"]["inFlight"] == 0, timeout_s=60,
             what="node B to drop the incomplete transfer")

    # The cluster ended the command, and the model serves on.
    assert ask(sdk, TWO_CHUNKS).choices[0].message.content == answered.choices[0].message.content
    assert diagnostics(b)["inputTransfers"]["completed"] == 2
