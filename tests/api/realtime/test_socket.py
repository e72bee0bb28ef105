"""WS /v1/realtime's refusals, in-process: a model that is no realtime speech-to-text
model, bad audio, an empty commit and an unknown event are `error` events in OpenAI's
realtime shape, and the socket stays open; a foreign page cannot open it. (Transcription
itself runs on real nodes: tests/e2e/test_realtime.py.)"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import MODEL

BETA = {"openai-beta": "realtime=v1"}


def receive(ws: Any) -> dict[str, Any]:
    return json.loads(ws.receive_text())


def test_refusals_keep_the_socket_open() -> None:
    app, cluster = scripted_app(["Hi"])
    with TestClient(app) as client, client.websocket_connect("/v1/realtime?intent=transcription", headers=BETA) as ws:
        created = receive(ws)
        assert created["type"] == "transcription_session.created"
        assert created["session"]["turn_detection"]["type"] == "server_vad"
        for event, code, param in [
            ({"type": "transcription_session.update", "session": {"input_audio_transcription": {"model": MODEL}}},
             "model_not_stt", "session.input_audio_transcription.model"),
            ({"type": "transcription_session.update", "session": {"input_audio_format": "g711_alaw"}},
             "unsupported_audio_format", "session.input_audio_format"),
            ({"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "c1"}, "invalid_audio", "audio"),
            ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
            ({"type": "response.create"}, "unknown_event", "type"),
            ({"type": "session.update", "session": {"response": {"model": "nobody/placed"}}}, "model_not_found",
             "session.response.model"),
        ]:
            ws.send_text(json.dumps(event))
            error = receive(ws)
            assert error["type"] == "error", error
            assert (error["error"]["code"], error["error"]["param"]) == (code, param), error
            assert error["error"]["type"] == "invalid_request_error"
        ws.send_text("not json")
        assert receive(ws)["error"]["code"] == "invalid_event"
        # still open: an append of real PCM (no model named yet) is taken silently, a commit refused for the model
        ws.send_text(json.dumps({"type": "input_audio_buffer.append",
                                 "audio": base64.b64encode(b"\0\0" * 4800).decode()}))
        ws.send_text(json.dumps({"type": "input_audio_buffer.commit"}))
        assert receive(ws)["error"]["code"] == "missing_model"
        # an update is answered in its own dialect
        ws.send_text(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        updated = receive(ws)
        assert updated["type"] == "session.updated" and updated["session"]["type"] == "transcription"
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert not cluster.commands


def test_a_model_named_in_the_query_is_checked_at_once() -> None:
    app, _ = scripted_app(["Hi"])
    with TestClient(app) as client, client.websocket_connect(f"/v1/realtime?model={MODEL}") as ws:
        assert receive(ws)["type"] == "session.created"  # a GA client (no OpenAI-Beta header)
        assert receive(ws)["error"]["code"] == "model_not_stt"


def test_a_page_from_a_foreign_origin_cannot_open_it() -> None:
    app, _ = scripted_app(["Hi"])
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect) as refused, \
                client.websocket_connect("/v1/realtime", headers={"origin": "https://evil.example"}):
            pass
        assert refused.value.code == 1008


def test_a_browser_presents_the_key_as_a_subprotocol() -> None:
    app, _ = scripted_app(["Hi"], context_fields={"api_key": "sesame"})
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/v1/realtime"):
            pass
        assert refused.value.code == 1008
        with pytest.raises(WebSocketDisconnect), \
                client.websocket_connect("/v1/realtime", subprotocols=["realtime", "openai-insecure-api-key.wrong"]):
            pass
        with client.websocket_connect("/v1/realtime", subprotocols=["realtime", "openai-insecure-api-key.sesame"]) as ws:
            assert ws.accepted_subprotocol == "realtime"
            assert receive(ws)["type"] == "session.created"
        with client.websocket_connect("/v1/realtime", headers={"authorization": "Bearer sesame"}) as ws:
            assert receive(ws)["type"] == "session.created"


def test_sessions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from skulk.api.routes import realtime

    app, _ = scripted_app(["Hi"])
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as first:
        assert receive(first)["type"] == "session.created"
        monkeypatch.setattr(realtime, "MAX_SESSIONS", realtime.COUNTERS["sessions_open"])
        with client.websocket_connect("/v1/realtime") as second:
            refused = receive(second)
            assert refused["error"]["code"] == "too_many_sessions"
            with pytest.raises(WebSocketDisconnect) as closed:
                second.receive_text()
            assert closed.value.code == 1013
