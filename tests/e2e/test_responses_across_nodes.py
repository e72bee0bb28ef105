"""Stored Responses across nodes: a response answered through node A is read and continued
through node B (B asks its peers, with the peer token and the caller's key scope), with the
official OpenAI SDK against two real nodes; deleting it through B says where it lives."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, client, place, wait_instance_ready
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)


def test_a_response_stored_on_one_node_is_continued_through_another(spawn_node):
    a, b = start_linked(spawn_node, ["resp-a", "resp-b"])
    wait_agreed([a, b], members=2)
    wait_instance_ready(a, place(a)["instanceId"])
    # Node B must see the instance before it serves the model.
    wait_for(lambda: b.get("/state").json()["instances"], timeout_s=30, interval_s=0.25, what="B to see the instance")

    through_a, through_b = client(a), client(b)
    first = through_a.responses.create(model=MODEL, input="Tell me about the sea.", max_output_tokens=4)
    assert through_b.responses.retrieve(first.id).output_text == first.output_text

    second = through_b.responses.create(model=MODEL, previous_response_id=first.id, input="And the sky?",
                                        max_output_tokens=4)
    assert second.usage.input_tokens > first.usage.input_tokens  # A's stored turns came along

    # The peers' route answers peers only (the peer token), not a client of the node.
    assert httpx.get(f"{a.url}/v1/responses/{first.id}/conversation", timeout=10).status_code == 404

    with pytest.raises(openai.BadRequestError) as caught:
        through_b.responses.delete(first.id)
    assert caught.value.code == "stored_on_another_node"
    through_a.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        through_b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        through_b.responses.retrieve("resp_never_stored")


def test_a_websocket_session_and_a_compaction_through_a_real_node(spawn_node):
    """The official SDK's WebSocket mode (`responses.connect`) on a real node: two turns
    chained by previous_response_id with store=false (the socket remembers them), then the
    conversation compacted and continued from the compaction items."""
    (node,) = start_linked(spawn_node, ["socket"])
    wait_agreed([node], members=1)
    wait_instance_ready(node, place(node)["instanceId"])
    sdk = client(node)

    def turn(connection, **fields) -> list:
        connection.send({"type": "response.create", "model": MODEL, "max_output_tokens": 6, "store": False,
                         **fields})
        events = []
        for event in connection:
            events.append(event)
            if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
                break
        return events

    with sdk.responses.connect() as connection:
        first = turn(connection, input="Tell me about the sea.")
        assert first[-1].type in ("response.completed", "response.incomplete"), first[-1]
        first_id = first[-1].response.id
        text = "".join(e.delta for e in first if e.type == "response.output_text.delta")
        assert text and first[-1].response.output[0].content[0].text == text
        second = turn(connection, input="And the sky?", previous_response_id=first_id)
        assert second[-1].type in ("response.completed", "response.incomplete"), second[-1]
        assert second[-1].response.usage.input_tokens > first[-1].response.usage.input_tokens
        second_id = second[-1].response.id
    with pytest.raises(openai.NotFoundError):  # store=false: nothing was kept beyond the socket
        sdk.responses.retrieve(first_id)
    assert second_id

    stored = sdk.responses.create(model=MODEL, input="Tell me about the sea.", max_output_tokens=6)
    compacted = sdk.responses.compact(model=MODEL, previous_response_id=stored.id, input="Keep it short.")
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    assert compacted.output[-1].encrypted_content and compacted.usage.output_tokens > 0
    items = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    resumed = sdk.responses.create(model=MODEL, input=[*items, {"role": "user", "content": "Go on."}],
                                   max_output_tokens=4)
    assert resumed.status in ("completed", "incomplete") and resumed.output_text
