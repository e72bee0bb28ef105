"""Attack: bodies and conversations big enough to wedge the API or a model.

Before (parent commit, scripted cluster behind a real uvicorn): a 20 MB chat body was read,
parsed and forwarded (200; the issue measured a 50 MB body at 25 s and ~4 GB to refuse),
and a 100,000-message chat (4.6 MB) was parsed, validated and sent on to a runner (200 after
1.5 s of API time; on a real runner its tokenization then ran for 12+ minutes).

Now: a body over `api.max_body_bytes` is a 413 in the caller's wire shape, decided from its
Content-Length before a byte of it is read, or from the running count of a chunked body; a
100,000-message chat is a 400 naming `messages` after one pass over the raw JSON (0.07 s
measured), nothing reaches the cluster, and another client is served meanwhile.
"""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from skulk.api.limits import DEFAULT_MAX_BODY_BYTES, MAX_MESSAGES, RequestLimits
from skulk.datadir.config import ConfigError, SkulkConfig, parse_config, with_env_overrides
from skulk.shared.types.commands import GenerateText
from tests.api.live_server import live_server
from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import INSTANCE, MODEL

pytestmark = pytest.mark.timeout(120)

SMALL_LIMIT = 64 * 1024


def app_with(limit: int = DEFAULT_MAX_BODY_BYTES):
    return scripted_app(["Hel", "lo"], context_fields={"instance_lookup": lambda _m: INSTANCE,
                                                       "limits": RequestLimits(max_body_bytes=limit)})


def declared_only(base_url: str, path: str, declared: int) -> tuple[int, bytes]:
    """Send headers declaring a `declared`-byte body and a few bytes of it; read the answer."""
    parts = urlsplit(base_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {declared}\r\n\r\n".encode() + b'{"model": "')
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) == 0:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/ollama/api/chat", "ollama"),
     ("/place_instance", "native")],
)
def test_a_declared_body_over_the_limit_is_413_before_it_is_read(path, shape):
    app, cluster = app_with()
    with live_server(app) as base:
        status, body = declared_only(base, path, 50 * 1024 * 1024)
    assert status == 413
    text = body.decode()
    payload = json.loads(text[text.index("{"): text.rindex("}") + 1])
    if shape == "openai":
        assert payload["error"]["code"] == "request_too_large"
    elif shape == "anthropic":
        assert payload["type"] == "error" and payload["error"]["type"] == "request_too_large"
    elif shape == "ollama":
        assert "larger than this node accepts" in payload["error"]
    else:
        assert payload["errorKind"] == "too_large"
    assert cluster.commands == []


def test_a_chunked_body_is_counted_as_it_streams():
    app, cluster = app_with(SMALL_LIMIT)

    def chunks():
        for _ in range(8):
            yield b" " * (SMALL_LIMIT // 4)  # 2x the limit in all, no Content-Length

    with live_server(app) as base:
        response = httpx.post(base + "/v1/chat/completions", content=chunks(),
                              headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
        # just under the limit is served
        padded = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (SMALL_LIMIT - 200)}]})
        assert httpx.post(base + "/v1/chat/completions", content=padded,
                          headers={"content-type": "application/json"}, timeout=30).status_code == 200
    assert len([c for c in cluster.commands if isinstance(c, GenerateText)]) == 1


def test_a_100k_message_chat_is_400_and_another_client_is_served_meanwhile():
    app, cluster = app_with()
    many = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi <|eot_id|>"}] * 100_000})
    results: dict[str, httpx.Response] = {}
    with live_server(app) as base:
        def attack():
            results["attack"] = httpx.post(base + "/v1/chat/completions", content=many,
                                           headers={"content-type": "application/json"}, timeout=60)

        attacker = threading.Thread(target=attack)
        attacker.start()
        normal = httpx.post(base + "/v1/chat/completions", timeout=60,
                            json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}]})
        attacker.join(timeout=60)
    assert normal.status_code == 200 and normal.json()["choices"][0]["message"]["content"] == "Hello"
    refused = results["attack"]
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "messages" and error["code"] == "array_above_max_length" and str(MAX_MESSAGES) in error["message"]
    generated = [c for c in cluster.commands if isinstance(c, GenerateText)]
    assert len(generated) == 1 and cluster.params().messages[0].content == "hello"


def test_a_prompt_that_cannot_fit_the_context_never_reaches_a_runner():
    app, cluster = app_with()
    huge = "word " * (INSTANCE.context_token_limit * 256 // 5 + 1)  # over 256 bytes per context token
    with live_server(app) as base:
        response = httpx.post(base + "/v1/chat/completions", timeout=60,
                              json={"model": MODEL, "messages": [{"role": "user", "content": huge}]})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert not any(isinstance(c, GenerateText) for c in cluster.commands)


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("", {}, DEFAULT_MAX_BODY_BYTES),
        ("api:\n  max_body_bytes: 1048576\n", {}, 1048576),
        ("api:\n  max_body_bytes: 1048576\n", {"SKULK_API_MAX_BODY_BYTES": "2097152"}, 2097152),
        ("api:\n  max_body_bytes: 100\n", {}, ConfigError),
        ("", {"SKULK_API_MAX_BODY_BYTES": "lots"}, ConfigError),
        ("", {"SKULK_API_MAX_BODY_BYTES": "100"}, ConfigError),
        ("api:\n  max_body_bytes: 1073741824\n", {}, ConfigError),  # over what the transport carries
    ],
)
def test_the_limit_is_a_setting(tmp_path, text, env, expected):
    def resolve() -> SkulkConfig:
        return with_env_overrides(parse_config(text, tmp_path / "skulk.yaml"), env)

    if expected is ConfigError:
        with pytest.raises(ConfigError):
            resolve()
    else:
        assert resolve().api.max_body_bytes == expected


def test_a_real_node_applies_its_configured_limit(spawn_node):
    node = spawn_node("limited", env={"SKULK_API_MAX_BODY_BYTES": str(SMALL_LIMIT)}).wait_ready()
    body = json.dumps({"model": "local/tiny-llama-gguf", "messages": [{"role": "user", "content": "x" * SMALL_LIMIT}]})
    response = httpx.post(node.url + "/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413 and str(SMALL_LIMIT) in response.json()["error"]["message"]
    small = httpx.post(node.url + "/v1/chat/completions", timeout=30,
                       json={"model": "local/tiny-llama-gguf", "messages": [{"role": "user", "content": "hi"}]})
    assert small.status_code == 404  # under the limit: on to the route (nothing is placed)
    # and the same node answers invalid Unicode in a path with a 400, not a 500 and a reset
    bad = httpx.post(node.url + "/models/add", content='{"path": "/tmp/\\ud800.gguf"}',
                     headers={"content-type": "application/json"}, timeout=30)
    assert bad.status_code == 400 and "Unicode" in bad.json()["detail"]


def test_an_audio_upload_has_its_own_limit():
    """The upload routes take files far over the text limit, up to 25 MiB plus the form, and
    no more: a declared 30 MB upload is refused before a byte is read."""
    app, cluster = app_with(SMALL_LIMIT)
    upload = {"file": ("speech.wav", b"\0" * (1024 * 1024), "audio/wav")}
    with live_server(app) as base:
        status, body = declared_only(base, "/v1/audio/transcriptions", 30 * 1024 * 1024)
        assert status == 413 and b"audio_too_large" in body
        past_the_text_limit = httpx.post(base + "/v1/audio/transcriptions", files=upload,
                                         data={"model": "no/such-model"}, timeout=30)
        assert past_the_text_limit.status_code == 404, past_the_text_limit.text  # read, then: no such model
        chat = httpx.post(base + "/v1/chat/completions", files=upload, timeout=30)
        assert chat.status_code == 413
    assert cluster.commands == []
