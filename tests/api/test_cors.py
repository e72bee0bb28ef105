"""CORS: pages from this machine may call the API by default, other origins only when
configured; a preflight is answered before (and without) the API key, and errors carry the
headers a page needs to read them."""

from __future__ import annotations

import pytest

from tests.api.scripted_cluster import asgi_http, scripted_app

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


async def preflight(origin: str, *, cors_origins=(), api_key="secret"):
    app, _ = scripted_app(context_fields={"api_key": api_key, "cors_origins": tuple(cors_origins)})
    async with asgi_http(app) as http:
        return await http.options("/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})


@pytest.mark.parametrize(("origin", "cors_origins", "allowed"), [
    ("http://localhost:3000", (), True),
    ("http://127.0.0.1:8080", (), True),
    ("https://localhost", (), True),
    ("http://[::1]:5173", (), True),
    ("app://localhost", (), True),
    ("http://192.168.1.20:3000", (), False),
    ("http://localhost.evil.example", (), False),
    ("http://192.168.1.20:3000", ("http://192.168.1.20:3000",), True),
    ("http://192.168.1.20:3000", ("http://192.168.1.20:3000/",), True),
    ("http://192.168.1.21:3000", ("http://192.168.1.20:3000",), False),
    ("https://anything.example", ("*",), True),
])
async def test_preflight_is_answered_for_allowed_origins_only(origin, cors_origins, allowed):
    reply = await preflight(origin, cors_origins=cors_origins)
    if allowed:
        assert reply.status_code == 200, reply.text
        assert reply.headers["access-control-allow-origin"] in (origin, "*")
        assert "authorization" in reply.headers["access-control-allow-headers"].lower()
    else:
        assert reply.status_code == 400
        assert "access-control-allow-origin" not in reply.headers


async def test_a_refused_key_still_reaches_the_page_with_cors_headers():
    app, _ = scripted_app(context_fields={"api_key": "secret"})
    async with asgi_http(app) as http:
        reply = await http.get("/v1/models", headers={"Origin": "http://localhost:3000"})
        assert reply.status_code == 401
        assert reply.headers["access-control-allow-origin"] == "http://localhost:3000"
        served = await http.get("/v1/models", headers={"Origin": "http://localhost:3000",
                                                       "Authorization": "Bearer secret"})
        assert served.status_code == 200 and served.headers["access-control-allow-origin"] == "http://localhost:3000"
        foreign = await http.get("/v1/models", headers={"Origin": "http://192.168.1.20",
                                                        "Authorization": "Bearer secret"})
        assert foreign.status_code == 200 and "access-control-allow-origin" not in foreign.headers
