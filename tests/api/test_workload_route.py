"""The one route every one-result workload shares (`/v1/workloads/{kind}`), against the
scripted cluster: a workload runs only on an engine whose traits row serves it (a 400
naming workload and engine otherwise, before any command), its input travels to the
runner whole while the master's command is redacted, and its one result comes back."""

from __future__ import annotations

import pytest

from skulk.shared.types.commands import RunWorkload
from skulk.shared.types.engines import ENGINE_TRAITS
from skulk.shared.types.workloads import WORKLOADS
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_request_options import served_by


@pytest.mark.parametrize("engine", sorted(ENGINE_TRAITS))
async def test_echo_follows_the_table(engine):
    app, cluster = scripted_app(state=served_by(f"{engine}-cpu"))
    async with asgi_http(app) as http:
        reply = await http.post("/v1/workloads/echo", json={"model": MODEL, "text": "one two three"})
    if "echo" in ENGINE_TRAITS[engine].workloads:
        assert reply.status_code == 200, reply.text
        assert reply.json()["result"] == {"workload": "echo", "text": "one two three", "tokens": [0, 1, 2]}
        (command,) = [c for c in cluster.commands if isinstance(c, RunWorkload)]
        assert command.params.text == ""  # the master's copy: redacted
        assert cluster.params(RunWorkload).text == "one two three"  # the runner's: whole
    else:
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "unsupported_feature", reply.text
        assert f"the {engine} engine" in reply.json()["error"]["message"] and not cluster.commands


async def test_embeddings_run_through_the_generic_route_too():
    app, _ = scripted_app(vectors=lambda n: [[1.0, 0.0]] * n, state=served_by("llama_cpp-cpu"))
    async with asgi_http(app) as http:
        reply = await http.post("/v1/workloads/embeddings", json={"model": MODEL, "inputs": ["a", "b"]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["embeddings"] == [[1.0, 0.0], [1.0, 0.0]]


async def test_the_listing_is_the_table():
    app, _ = scripted_app()
    async with asgi_http(app) as http:
        listed = (await http.get("/v1/workloads")).json()["workloads"]
    assert [row["kind"] for row in listed] == list(WORKLOADS)
    assert all(row["engines"] for row in listed)
