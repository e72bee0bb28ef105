"""WS /v1/fabric/chains/speech's refusals, in-process: a first frame that is not a typed
session update, or that names a model the cluster cannot run in that role, is one `error`
event in the realtime shape and then a close with 1008; the API key and origin rules are
realtime's. (The chain itself runs on real nodes: tests/e2e/test_speech_chain.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import MODEL

PATH = "/v1/fabric/chains/speech"


def receive(ws: Any) -> dict[str, Any]:
    return json.loads(ws.receive_text())


@pytest.mark.parametrize(("frame", "code", "param"), [
    ("not json", "invalid_value", "event"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "invalid_event", "type"),
    (json.dumps({"type": "session.update", "session": {}}), "missing_required_parameter", "session.stt"),
    (json.dumps({"type": "session.update", "session": {"stt": {"model": "nobody/known"}}}), "model_not_found",
     "session.stt.model"),
    (json.dumps({"type": "session.update", "session": {"stt": {"model": MODEL}, "tts": {"model": MODEL}}}),
     "tts_without_chat", "session.tts"),
    (json.dumps({"type": "session.update", "session": {"stt": {"model": MODEL}, "extra": 1}}), "unknown_parameter",
     "session.extra"),
])
def test_a_bad_first_frame_is_an_error_then_a_close(frame: str, code: str, param: str) -> None:
    app, cluster = scripted_app(["Hi"])
    with TestClient(app) as client, client.websocket_connect(PATH) as ws:
        ws.send_text(frame)
        error = receive(ws)
        assert error["type"] == "error", error
        assert (error["error"]["code"], error["error"]["param"]) == (code, param), error
        assert error["error"]["type"] == "invalid_request_error"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1008
    assert not cluster.commands


def test_the_key_and_origin_rules_are_realtimes() -> None:
    app, _ = scripted_app(["Hi"], context_fields={"api_key": "sesame"})
    with TestClient(app) as client:
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect(PATH):
            pass
        assert refused.value.code == 1008
        with client.websocket_connect(PATH, subprotocols=["realtime", "openai-insecure-api-key.sesame"]) as ws:
            assert ws.accepted_subprotocol == "realtime"
            ws.send_text(json.dumps({"type": "session.update", "session": {}}))
            assert receive(ws)["error"]["code"] == "missing_required_parameter"
        with pytest.raises(WebSocketDisconnect) as foreign, \
                client.websocket_connect(PATH, headers={"origin": "https://evil.example", "authorization": "Bearer sesame"}):
            pass
        assert foreign.value.code == 1008
