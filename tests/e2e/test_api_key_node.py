"""A real node started with SKULK_API_KEY, and keys required from loopback too (the default
exempts the node's own machine), refuses every route without the key."""

import httpx
import openai
import pytest

from tests.nodeproc import wait_for

KEY = "s3cret-key"


def test_node_with_api_key_refuses_missing_and_wrong_keys(spawn_node):
    node = spawn_node("keyed", env={"SKULK_API_KEY": KEY, "SKULK_API_REQUIRE_KEY_ON_LOOPBACK": "1"})
    auth = {"Authorization": f"Bearer {KEY}"}
    wait_for(lambda: httpx.get(node.url + "/node_id", headers=auth, timeout=5).status_code == 200,
             timeout_s=60, what="keyed node up")
    for path in ("/node_id", "/state", "/v1/cluster", "/v1/models", "/ollama/api/tags"):
        assert httpx.get(node.url + path, timeout=5).status_code == 401, path
        assert httpx.get(node.url + path, headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
        assert httpx.get(node.url + path, headers=auth, timeout=5).status_code == 200, path
    refused = httpx.post(node.url + "/v1/messages", json={}, headers={"x-api-key": "nope"}, timeout=5)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=node.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert openai.OpenAI(base_url=node.url + "/v1", api_key=KEY, max_retries=0).models.list().data == []
