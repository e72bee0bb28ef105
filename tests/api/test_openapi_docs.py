"""The OpenAPI document and /docs: errors documented in each wire format's shape (never
FastAPI's 422, which Skulk does not send), accepted request fields listed, and the docs page
served with its assets from this node (no CDN)."""

from __future__ import annotations

import re

from tests.api.scripted_cluster import asgi_http, scripted_app


async def test_generation_routes_document_their_errors_and_fields():
    app, _ = scripted_app()
    async with asgi_http(app) as http:
        schema = (await http.get("/openapi.json")).json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "404", "503"} <= set(chat) and "422" not in chat
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    messages = schema["paths"]["/v1/messages"]["post"]["responses"]
    assert messages["529"]["content"]["application/json"]["schema"]["$ref"].endswith("/AnthropicError")
    assert schema["paths"]["/ollama/api/chat"]["post"]["responses"]["400"]["content"]["application/json"][
        "schema"]["$ref"].endswith("/OllamaError")
    assert "/v1/messages/count_tokens" in schema["paths"] and "/ollama/api/pull" in schema["paths"]
    fields = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"response_format", "frequency_penalty", "presence_penalty", "logit_bias", "n"} <= set(fields)
    assert not any("422" in op.get("responses", {}) for path in schema["paths"].values() for op in path.values())


async def test_docs_load_their_assets_from_this_node():
    app, _ = scripted_app()
    async with asgi_http(app) as http:
        page = (await http.get("/docs")).text
        assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page)
        assert assets and all(url.startswith("/") for url in assets), assets
        for url in assets:
            assert (await http.get(url)).status_code == 200, url
    assert "cdn" not in page.lower()
