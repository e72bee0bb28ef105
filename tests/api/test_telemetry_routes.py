"""GET/PUT /v1/telemetry and GET /v1/telemetry/preview on an app with a hand-built context:
the shapes the dashboard's switch reads, the consent persisted, the environment's veto
typed, and a generation's sample previewed without its text."""

from __future__ import annotations

import json

from skulk.observe.field_collector import FieldTelemetry
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import STATE
from tests.observe.telemetry_kit import FakeIngest, collector

PROMPT = "the secret plan for tuesday"
OUTPUT = ["zebra", "xylophone"]


def app_with(telemetry: FieldTelemetry | None):
    fields = {} if telemetry is None else {
        "get_telemetry_status": telemetry.status, "set_telemetry_enabled": telemetry.set_enabled,
        "preview_telemetry": telemetry.preview}
    app, cluster = scripted_app(OUTPUT, context_fields=fields)
    if telemetry is not None:
        cluster.streams.on_ended = telemetry.on_stream_ended  # as node.py wires it
    return app


async def test_the_status_shape(tmp_path):
    async with asgi_http(app_with(collector(tmp_path))) as http:
        response = await http.get("/v1/telemetry")
    assert response.status_code == 200
    assert response.json() == {
        "enabled": False, "consent": False, "disabledByEnv": False, "envVariable": "SKULK_TELEMETRY_DISABLE",
        "endpoint": "http://127.0.0.1:9/in", "flushSeconds": 1.0, "installId": None, "pending": 0,
        "capacity": 1000, "counters": {"sentBatches": 0, "sentSamples": 0, "failedSends": 0, "refusedBatches": 0,
                                       "droppedSamples": 0}}


async def test_opting_in_then_a_generation_is_previewed_without_its_text(tmp_path):
    (tmp_path / "skulk.yaml").write_text("# the operator's notes\nnode:\n  name: studio\n")
    ingest = FakeIngest()
    telemetry = collector(tmp_path, ingest=ingest, state=STATE)
    async with asgi_http(app_with(telemetry)) as http:
        response = await http.put("/v1/telemetry", json={"enabled": True})
        assert response.status_code == 200, response.text
        assert response.json()["enabled"] and response.json()["installId"]
        chat = await http.post("/v1/chat/completions", json={
            "model": "local/tiny-llama", "messages": [{"role": "user", "content": PROMPT}]})
        assert chat.status_code == 200
        preview = (await http.get("/v1/telemetry/preview")).json()
    assert preview["enabled"] and not preview["disabledByEnv"]
    batch = preview["batch"]
    assert batch["installId"] == response.json()["installId"] and batch["skulkVersion"] == "9.9.9"
    (sample,) = batch["samples"]
    assert sample["kind"] == "generation" and sample["model"] == "local/tiny-llama"
    assert sample["hardware"] == ["linux-x86_64-cpu-24gb"] and sample["outcome"] == "completed"
    assert sample["promptTokens"] == 7 and sample["completionTokens"] == 3 and sample["ttftMs"] is not None
    text = json.dumps(preview)
    for secret in (PROMPT, *OUTPUT, "studio", "n1", "i1", "r1"):
        assert secret not in text
    assert (tmp_path / "skulk.yaml").read_text() == (
        "# the operator's notes\nnode:\n  name: studio\ntelemetry:\n  enabled: true\n")
    await telemetry.flush()
    assert ingest.bodies[0]["samples"] == batch["samples"]


async def test_the_environment_wins_and_says_so(tmp_path):
    async with asgi_http(app_with(collector(tmp_path, enabled=True, env_disabled=True))) as http:
        refused = await http.put("/v1/telemetry", json={"enabled": True})
        status = (await http.get("/v1/telemetry")).json()
        preview = (await http.get("/v1/telemetry/preview")).json()
    assert refused.status_code == 409
    assert refused.json()["code"] == "telemetry_disabled_by_env" and refused.json()["param"] == "enabled"
    assert "SKULK_TELEMETRY_DISABLE" in refused.json()["detail"]
    assert status["enabled"] is False and status["disabledByEnv"] is True and status["consent"] is True
    assert preview["enabled"] is False and preview["disabledByEnv"] is True and preview["batch"]["samples"] == []
    assert not (tmp_path / "skulk.yaml").exists()


async def test_a_broken_config_is_a_conflict_not_a_crash(tmp_path):
    (tmp_path / "skulk.yaml").write_text("node: [\n")
    async with asgi_http(app_with(collector(tmp_path))) as http:
        response = await http.put("/v1/telemetry", json={"enabled": True})
    assert response.status_code == 409 and response.json()["code"] == "telemetry_config_unwritable"


async def test_bad_bodies_are_4xx(tmp_path):
    async with asgi_http(app_with(collector(tmp_path))) as http:
        for body in ({}, {"enabled": "maybe"}, {"enabled": True, "endpoint": "http://evil"}, [True], None):
            response = await http.put("/v1/telemetry", json=body)
            assert 400 <= response.status_code < 500, (body, response.text)
        assert 400 <= (await http.put("/v1/telemetry", content=b"{not json")).status_code < 500


async def test_a_node_without_a_collector_answers_503(tmp_path):
    async with asgi_http(app_with(None)) as http:
        for method, path in (("GET", "/v1/telemetry"), ("PUT", "/v1/telemetry"), ("GET", "/v1/telemetry/preview")):
            response = await http.request(method, path, json={"enabled": True} if method == "PUT" else None)
            assert response.status_code == 503 and response.json()["code"] == "telemetry_unavailable"
