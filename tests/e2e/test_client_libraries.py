"""LangChain and LiteLLM, as users point them at a node (OpenAI-compatible base URL),
against a real node serving the tiny GGUF: LangChain's `with_structured_output` (its default
method) returns a validated object, LiteLLM's JSON mode returns JSON, and a prompt longer
than the context surfaces as LiteLLM's `ContextWindowExceededError` (it maps OpenAI's
`context_length_exceeded`), streamed or not."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import BaseModel, Field

from tests.cluster.harness import start_linked, wait_agreed
from tests.e2e.test_openai_serving import MODEL, place, wait_instance_ready
from tests.e2e.test_request_options import token_of

pytestmark = pytest.mark.timeout(300)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM must not fetch its price list


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int


@pytest.fixture
def serving_node(spawn_node):
    (node,) = start_linked(spawn_node, ["solo"])
    wait_agreed([node], members=1)
    wait_instance_ready(node, place(node)["instanceId"])
    return node


def test_langchain_structured_output_and_litellm_json_mode_and_context_window(serving_node):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=serving_node.url + "/v1", api_key="unused", model=MODEL, max_tokens=200,
                      temperature=1.0, seed=4, max_retries=0, timeout=60)
    person = chat.with_structured_output(Person).invoke("Describe a person.")
    assert isinstance(person, Person)

    import litellm

    common = {"model": f"openai/{MODEL}", "api_base": serving_node.url + "/v1", "api_key": "unused",
              "num_retries": 0, "timeout": 60}
    reply = litellm.completion(messages=[{"role": "user", "content": "Describe a person as JSON."}],
                               response_format={"type": "json_object"}, max_tokens=300, temperature=1.0, seed=1,
                               logit_bias={str(token_of('"')): 10, str(token_of("}")): 10}, **common)
    assert isinstance(json.loads(reply.choices[0].message.content), dict)

    too_long = [{"role": "user", "content": "weather " * 3000}]
    for stream in (False, True):
        with pytest.raises(litellm.ContextWindowExceededError):
            response = litellm.completion(messages=too_long, max_tokens=8, stream=stream, **common)
            if stream:
                list(response)
