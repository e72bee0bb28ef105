"""Who may call which route: the node's access policy, as pure decisions.

A node is secure by default. It has an API key from its first start (`api.key` in the data
dir, or the configured one), and every client that is not on loopback must present it;
loopback clients need none unless `api.require_key_on_loopback` is set. Opening the API to
the LAN without any key is an explicit setting (`api.open_to_lan`) that the node warns about.

Routes come in two roles (`route_role`): inference (chat, completions, embeddings, the read
views of the cluster) and operator (placement, cards, the model store, tracing, purges,
diagnostics). When the node has an operator key as well, operator routes require it and the
API key is inference-only; with a single key, that key is both. Nodes of one cluster call
each other's APIs (store artifacts, probes, diagnostics) with a peer token derived from the
cluster key (`skulk.routing.cluster_key.derive_peer_token`), which carries the operator role:
a holder of the cluster key is a member of the cluster anyway.

The `Host` header is checked against the node's own names and addresses (plus
`api.allowed_hosts`) on every request, loopback included: that is what stops a web page
from reaching a node through DNS rebinding.

This module decides only; `skulk.api.auth` is the ASGI shell that applies a `Decision`.
It must never log or return a key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum


class Role(Enum):
    OPEN = "open"
    """No credential: the dashboard's static files (the page then asks for a key)."""
    INFERENCE = "inference"
    OPERATOR = "operator"


OPEN_PATHS: frozenset[str] = frozenset({"/", "/static", "/favicon.ico"})
OPEN_PATH_PREFIXES: tuple[str, ...] = ("/static/",)
"""Dashboard assets, served without a key (the dashboard itself then calls the API with one)."""

OPEN_POSTS: frozenset[str] = frozenset({"/v1/cluster/join"})
"""Redeeming a join invite: the joining node has no key yet; the invite's proof is its
credential (`skulk.api.routes.invites`)."""

OPERATOR_PREFIXES_ANY_METHOD: tuple[str, ...] = (
    "/store/", "/store",
    "/v1/diagnostics",
    "/v1/cluster/invites",
    "/v1/telemetry",
    "/v1/traces",
    "/metrics",
    "/ollama/api/pull", "/ollama/api/delete", "/ollama/api/copy", "/ollama/api/create", "/ollama/api/push",
)
"""Operator routes whatever the method: the model store (it serves weights and deletes
canonical copies), diagnostics and traces (they show configuration and timings), field
telemetry's consent switch and preview (the operator's choice, the install id), and the
Ollama routes that change what is on disk."""

OPERATOR_PREFIXES_WRITES: tuple[str, ...] = ("/place_instance", "/instance/", "/models/", "/models", "/v1/tracing")
"""Operator routes for any method but GET/HEAD: placing and deleting instances, adding and
deleting cards, switching tracing. Their reads (previews, the card list) are inference."""

READ_METHODS = frozenset({"GET", "HEAD"})


def route_role(method: str, path: str) -> Role:
    """The role a request needs. Unknown paths need inference (then 404 as usual)."""
    if path in OPEN_PATHS or path.startswith(OPEN_PATH_PREFIXES):
        return Role.OPEN
    if path in OPEN_POSTS and method.upper() == "POST":
        return Role.OPEN
    if path.startswith(OPERATOR_PREFIXES_ANY_METHOD):
        return Role.OPERATOR
    if method.upper() not in READ_METHODS and path.startswith(OPERATOR_PREFIXES_WRITES):
        return Role.OPERATOR
    return Role.INFERENCE


@dataclass(frozen=True)
class AccessPolicy:
    """What this node accepts. Keys are held here and nowhere else in the API."""

    api_key: str | None = field(default=None, repr=False)
    operator_key: str | None = field(default=None, repr=False)
    peer_token: str | None = field(default=None, repr=False)
    """The cluster members' credential (derived from the cluster key)."""
    require_key_on_loopback: bool = False
    open_to_lan: bool = False
    """No key from anyone (explicit operator choice; the node warns at start)."""
    allowed_hosts: frozenset[str] | None = None
    """Lower-case names and addresses `Host` may carry (without port); None: no check.
    A `*` entry disables the check."""

    @property
    def has_keys(self) -> bool:
        return bool(self.api_key or self.operator_key)


@dataclass(frozen=True)
class Principal:
    """Who made a request, as far as ownership goes (cancel your own requests only)."""

    id: str
    """`key:<fingerprint>`, `operator:<fingerprint>`, `peer`, `loopback` or `anonymous`."""
    operator: bool
    """May call operator routes."""

    @property
    def cancels_any(self) -> bool:
        """May cancel requests it did not make: a holder of the operator key, a cluster peer,
        or any caller of a node without an access policy."""
        return self.id.startswith("operator:") or self.id in ("peer", "anonymous-unchecked")


ANONYMOUS = Principal("anonymous-unchecked", operator=True)
"""Every caller of a node with no policy (unit tests' hand-built apps)."""


@dataclass(frozen=True)
class Allowed:
    principal: Principal


@dataclass(frozen=True)
class Refused:
    status: int
    code: str
    message: str


Decision = Allowed | Refused

MISSING_KEY_MESSAGE = ("This node requires an API key from clients that are not on its own machine. Send it as "
                       "'Authorization: Bearer <key>' (or 'x-api-key: <key>' on /v1/messages); `skulk api-key` "
                       "on the node prints it.")
WRONG_KEY_MESSAGE = "Incorrect API key provided."
OPERATOR_MESSAGE = ("This route changes the cluster and needs the operator key (api.operator_key); the key given "
                    "is for inference only.")
HOST_MESSAGE = ("The Host header {host!r} is not a name or address of this node. Add it to api.allowed_hosts "
                "(or SKULK_ALLOWED_HOSTS) if you reach the node through it.")


CROSS_SITE_MESSAGE = ("A web page from another site may call this node only with an API key (the keyless access "
                      "of clients on the node's own machine does not extend to pages they browse).")


def _same_site(policy: AccessPolicy, headers: Mapping[str, str]) -> bool:
    """Whether a keyless request may come from where a browser says it comes from: no
    `Origin` (not a browser, or a same-origin GET), or an origin on this node's own names."""
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return False
    origin = headers.get("origin")
    if not origin or origin == "null":
        return origin != "null"
    netloc = origin.split("://", 1)[-1]
    return host_allowed(policy, netloc)


def fingerprint(key: str) -> str:
    """A short, non-reversible name for a key (to tell owners apart; never the key)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _same(given: str, expected: str | None) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode("utf-8"), (expected or "").encode("utf-8"))


WEBSOCKET_KEY_PROTOCOL = "openai-insecure-api-key."
"""A WebSocket subprotocol naming the API key (`openai-insecure-api-key.<key>`): how a
browser, which cannot set headers on a WebSocket, presents it (OpenAI's realtime clients
do the same)."""


def presented_keys(headers: Mapping[str, str], *, accept_x_api_key: bool = True) -> list[str]:
    """The keys a request presents: the Bearer token, (where accepted) `x-api-key`, and a
    WebSocket's key subprotocol (`WEBSOCKET_KEY_PROTOCOL`)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    keys = []
    scheme, _, token = lowered.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if accept_x_api_key and lowered.get("x-api-key", "").strip():
        keys.append(lowered["x-api-key"].strip())
    for protocol in lowered.get("sec-websocket-protocol", "").split(","):
        if protocol.strip().startswith(WEBSOCKET_KEY_PROTOCOL) and protocol.strip()[len(WEBSOCKET_KEY_PROTOCOL):]:
            keys.append(protocol.strip()[len(WEBSOCKET_KEY_PROTOCOL):])
    return keys


def is_loopback(client_host: str | None) -> bool:
    """Whether the peer address is this machine's loopback (IPv4-mapped IPv6 included)."""
    if not client_host:
        return False
    try:
        address = ipaddress.ip_address(client_host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def host_name(host_header: str | None) -> str:
    """The host part of a `Host` header, lower-case, without port or IPv6 brackets."""
    value = (host_header or "").strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def host_allowed(policy: AccessPolicy, host_header: str | None) -> bool:
    if policy.allowed_hosts is None or "*" in policy.allowed_hosts:
        return True
    name = host_name(host_header)
    return name in policy.allowed_hosts or name.endswith(".localhost")


def own_hosts(names: Iterable[str], addresses: Iterable[str], extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a `Host` header may carry: the node's names and addresses, loopback, extras."""
    base = {"localhost", "127.0.0.1", "::1"}
    cleaned = {host_name(n) for n in (*names, *extra) if n} | {a.split("%", 1)[0].lower() for a in addresses if a}
    return frozenset(base | {c for c in cleaned if c and c not in ("0.0.0.0", "::")})


def _identify(policy: AccessPolicy, keys: list[str]) -> Principal | None:
    """The principal one of `keys` proves, checking every key in constant time."""
    found: Principal | None = None
    for key in keys:
        if _same(key, policy.operator_key):
            found = found or Principal(f"operator:{fingerprint(key)}", operator=True)
        elif _same(key, policy.peer_token):
            found = found or Principal("peer", operator=True)
        elif _same(key, policy.api_key):
            # The single key is both roles; beside an operator key it is inference only.
            found = found or Principal(f"key:{fingerprint(key)}", operator=not policy.operator_key)
    return found


def decide(
    policy: AccessPolicy | None,
    *,
    method: str,
    path: str,
    client_host: str | None,
    headers: Mapping[str, str],
    accept_x_api_key: bool,
) -> Decision:
    """Whether a request may proceed, and as whom (see the module docstring)."""
    if policy is None:
        return Allowed(ANONYMOUS)
    if not host_allowed(policy, headers.get("host")):
        return Refused(403, "host_not_allowed", HOST_MESSAGE.format(host=host_name(headers.get("host"))))
    role = route_role(method, path)
    keys = presented_keys(headers, accept_x_api_key=accept_x_api_key)
    principal = _identify(policy, keys)
    if role is Role.OPEN:
        return Allowed(principal or Principal("anonymous", operator=False))
    if principal is None:
        # A caller who needs no key may send any (the OpenAI SDK always sends one: clients
        # on the node's own machine pass a placeholder); it is then not checked.
        keyless = policy.open_to_lan or not policy.has_keys or (
            is_loopback(client_host) and not policy.require_key_on_loopback)
        if not keyless:
            return Refused(401, "invalid_api_key", WRONG_KEY_MESSAGE if keys else MISSING_KEY_MESSAGE)
        if not _same_site(policy, headers):
            # A browser on this machine carries no key: a page from elsewhere must not ride
            # on its loopback exemption (cross-site request forgery).
            return Refused(403, "cross_site_refused", CROSS_SITE_MESSAGE)
        principal = Principal("loopback" if is_loopback(client_host) else "anonymous", operator=True)
    if role is Role.OPERATOR and not principal.operator:
        return Refused(403, "operator_key_required", OPERATOR_MESSAGE)
    return Allowed(principal)


__all__ = [
    "ANONYMOUS",
    "WEBSOCKET_KEY_PROTOCOL",
    "AccessPolicy",
    "Allowed",
    "Decision",
    "Principal",
    "Refused",
    "Role",
    "decide",
    "fingerprint",
    "host_allowed",
    "host_name",
    "is_loopback",
    "own_hosts",
    "presented_keys",
    "route_role",
]
