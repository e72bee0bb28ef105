"""The access policy as a table: who may call which route (`skulk.api.access.decide`)."""

from __future__ import annotations

import pytest

from skulk.api.access import (
    AccessPolicy,
    Allowed,
    Refused,
    Role,
    decide,
    host_name,
    is_loopback,
    own_hosts,
    route_role,
)

KEY, OP, PEER = "api-key-1", "operator-key-1", "skulk-peer-xyz"
HOSTS = own_hosts(["studio"], ["192.168.1.20"])
SINGLE = AccessPolicy(api_key=KEY, peer_token=PEER, allowed_hosts=HOSTS)
SPLIT = AccessPolicy(api_key=KEY, operator_key=OP, peer_token=PEER, allowed_hosts=HOSTS)
STRICT = AccessPolicy(api_key=KEY, require_key_on_loopback=True, allowed_hosts=HOSTS)
OPEN = AccessPolicy(api_key=None, open_to_lan=True, allowed_hosts=HOSTS)

LAN, LOCAL = "192.168.1.33", "127.0.0.1"


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "host": "192.168.1.20:52415"}


NO_KEY = {"host": "192.168.1.20:52415"}


@pytest.mark.parametrize(
    ("name", "policy", "method", "path", "client", "headers", "expected"),
    [
        ("LAN without key: refused", SINGLE, "GET", "/v1/models", LAN, NO_KEY, 401),
        ("LAN wrong key: refused", SINGLE, "GET", "/v1/models", LAN, bearer("nope"), 401),
        ("LAN with key: inference", SINGLE, "POST", "/v1/chat/completions", LAN, bearer(KEY), "key"),
        ("single key is also operator", SINGLE, "POST", "/place_instance", LAN, bearer(KEY), "key"),
        ("loopback needs no key", SINGLE, "POST", "/place_instance", LOCAL, {"host": "localhost:52415"}, "loopback"),
        ("loopback placeholder key is not checked", SINGLE, "GET", "/v1/models", LOCAL,
         {"authorization": "Bearer sk-none", "host": "127.0.0.1"}, "loopback"),
        ("loopback key required when configured", STRICT, "GET", "/v1/models", LOCAL, {"host": "localhost"}, 401),
        ("split: api key cannot place", SPLIT, "POST", "/place_instance", LAN, bearer(KEY), 403),
        ("split: api key cannot touch the store", SPLIT, "GET", "/store/models", LAN, bearer(KEY), 403),
        ("split: api key cannot delete an instance", SPLIT, "DELETE", "/instance/i1", LAN, bearer(KEY), 403),
        ("split: api key cannot switch tracing", SPLIT, "PUT", "/v1/tracing", LAN, bearer(KEY), 403),
        ("split: api key cannot pull through ollama", SPLIT, "POST", "/ollama/api/pull", LAN, bearer(KEY), 403),
        ("split: api key reads previews", SPLIT, "GET", "/instance/previews", LAN, bearer(KEY), "key"),
        ("split: api key chats", SPLIT, "POST", "/ollama/api/chat", LAN, bearer(KEY), "key"),
        ("split: operator key places", SPLIT, "POST", "/place_instance", LAN, bearer(OP), "operator"),
        ("split: operator key chats too", SPLIT, "POST", "/v1/chat/completions", LAN, bearer(OP), "operator"),
        ("peer token reaches the store", SPLIT, "GET", "/store/artifacts/x/y", LAN, bearer(PEER), "peer"),
        ("dashboard page is open", SPLIT, "GET", "/", LAN, NO_KEY, "anonymous"),
        ("dashboard assets are open", SPLIT, "GET", "/static/app.js", LAN, NO_KEY, "anonymous"),
        ("forged Host from LAN", SINGLE, "GET", "/v1/models", LAN, {**bearer(KEY), "host": "evil.example"}, 403),
        ("forged Host from loopback (DNS rebinding)", SINGLE, "GET", "/state", LOCAL, {"host": "evil.example:52415"},
         403),
        ("node name is a good Host", SINGLE, "GET", "/state", LAN, {**bearer(KEY), "host": "studio:52415"}, "key"),
        ("*.localhost is a good Host", SINGLE, "GET", "/state", LOCAL, {"host": "app.localhost:52415"}, "loopback"),
        ("cross-site page rides on loopback: refused", SINGLE, "POST", "/store/models/x/fetch", LOCAL,
         {"host": "localhost:52415", "origin": "https://evil.example"}, 403),
        ("cross-site fetch metadata: refused", SINGLE, "POST", "/place_instance", LOCAL,
         {"host": "localhost:52415", "sec-fetch-site": "cross-site"}, 403),
        ("opaque origin: refused", SINGLE, "POST", "/place_instance", LOCAL,
         {"host": "localhost:52415", "origin": "null"}, 403),
        ("a local web UI's origin is fine", SINGLE, "POST", "/v1/chat/completions", LOCAL,
         {"host": "localhost:52415", "origin": "http://localhost:3000"}, "loopback"),
        ("the dashboard's own origin is fine", SINGLE, "POST", "/place_instance", LOCAL,
         {"host": "127.0.0.1:52415", "origin": "http://127.0.0.1:52415"}, "loopback"),
        ("a cross-site page with the key is fine", SINGLE, "POST", "/v1/chat/completions", LAN,
         {**bearer(KEY), "origin": "https://chat.example"}, "key"),
        ("open to the LAN: no key needed", OPEN, "POST", "/place_instance", LAN, NO_KEY, "anonymous"),
        ("no policy: everything open", None, "DELETE", "/store/models/x", LAN, {}, "anonymous-unchecked"),
    ],
)
def test_decide(name, policy, method, path, client, headers, expected):
    decision = decide(policy, method=method, path=path, client_host=client, headers=headers,
                      accept_x_api_key=path.startswith("/v1/messages"))
    if isinstance(expected, int):
        assert isinstance(decision, Refused) and decision.status == expected, decision
        assert KEY not in decision.message and OP not in decision.message
    else:
        assert isinstance(decision, Allowed), decision
        assert decision.principal.id.split(":")[0] == expected


def test_principals_of_different_keys_differ_and_never_show_the_key():
    one = decide(SPLIT, method="GET", path="/v1/models", client_host=LAN, headers=bearer(KEY), accept_x_api_key=False)
    two = decide(SPLIT, method="GET", path="/v1/models", client_host=LAN, headers=bearer(OP), accept_x_api_key=False)
    assert isinstance(one, Allowed) and isinstance(two, Allowed)
    assert one.principal.id != two.principal.id
    assert KEY not in one.principal.id and OP not in two.principal.id
    assert two.principal.cancels_any and not one.principal.cancels_any


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        ("GET", "/", Role.OPEN),
        ("GET", "/v1/models", Role.INFERENCE),
        ("POST", "/v1/messages", Role.INFERENCE),
        ("POST", "/v1/cancel/abc", Role.INFERENCE),
        ("GET", "/state", Role.INFERENCE),
        ("GET", "/models", Role.INFERENCE),
        ("POST", "/models/add", Role.OPERATOR),
        ("DELETE", "/models/custom/x", Role.OPERATOR),
        ("GET", "/metrics", Role.OPERATOR),
        ("GET", "/v1/diagnostics/node", Role.OPERATOR),
        ("POST", "/store/purge-staging", Role.OPERATOR),
        ("GET", "/v1/tracing", Role.INFERENCE),
        ("POST", "/v1/cluster/invites", Role.OPERATOR),
        ("GET", "/v1/cluster", Role.INFERENCE),
        ("POST", "/v1/cluster/join", Role.OPEN),
        ("GET", "/v1/cluster/join", Role.INFERENCE),
        ("GET", "/v1/telemetry", Role.OPERATOR),
        ("PUT", "/v1/telemetry", Role.OPERATOR),
        ("GET", "/v1/telemetry/preview", Role.OPERATOR),
    ],
)
def test_route_roles(method, path, role):
    assert route_role(method, path) is role


@pytest.mark.parametrize(
    ("header", "name"),
    [("Example.COM:80", "example.com"), ("[::1]:52415", "::1"), ("::1", "::1"), ("host.", "host"), (None, "")],
)
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("192.168.1.2", False), ("testclient", False), (None, False)],
)
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback
