"""The one way this node's observability code calls another node's HTTP API.

Cluster diagnostics and trace gathering ask peers for their local reports through
`get_from_peer`, which owns the addressing (the peer's verified or advertised API
endpoint), the credentials a node presents to a peer (`peer_headers`: the peer token every
member derives from the cluster key, `skulk.api.app.ApiContext.peer_credential`) and the
per-call deadline. Changing how
nodes authenticate to each other means changing `peer_headers`, nothing else.

It must never retry or block past its deadline: a peer that does not answer in time is
reported unreachable, and the caller lists it as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State

PEER_REQUEST_DEADLINE_S = 4.0
"""Deadline of one request to a peer's API (connect + answer). A live peer on a loaded
machine answers a diagnostics report in well under a second; past this it is listed as
unreachable rather than holding the operator's request."""


class PeerRequestFailed(Exception):
    """The peer did not answer with a 200 and JSON before the deadline; the message says why
    and `status` is the HTTP status it answered with (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def peer_headers(api_key: str | None) -> dict[str, str]:
    """What a node presents to a peer's API: the cluster's API key as a Bearer token."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def peer_api_urls(state: State, verified: Mapping[NodeId, str], me: str) -> dict[str, str | None]:
    """Every other member's API base URL: the address membership probes verified (it
    answered with that node's id), else the endpoint the node advertised, else None (no
    API, or not known yet). Pure."""
    urls: dict[str, str | None] = {}
    for node_id, info in sorted(state.nodes.items()):
        if node_id == me:
            continue
        url = verified.get(node_id) or info.api_endpoint
        urls[node_id] = url.rstrip("/") if url else None
    return urls


async def get_from_peer(
    client: httpx.AsyncClient, base_url: str, path: str, *, api_key: str | None,
    deadline_s: float = PEER_REQUEST_DEADLINE_S, headers: Mapping[str, str] | None = None,
) -> Any:
    """GET `path` on the peer at `base_url` (with extra `headers`) and return its JSON body,
    or raise `PeerRequestFailed` saying why (refused, timed out, non-200, not JSON)."""
    try:
        response = await client.get(base_url + path, headers={**peer_headers(api_key), **(headers or {})},
                                    timeout=deadline_s)
    except httpx.TimeoutException:
        raise PeerRequestFailed(f"no answer within {deadline_s:g} s") from None
    except httpx.HTTPError as exc:
        raise PeerRequestFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
    if response.status_code != 200:
        raise PeerRequestFailed(f"HTTP {response.status_code}: {response.text[:200]}", response.status_code)
    try:
        return response.json()
    except ValueError:
        raise PeerRequestFailed("the answer was not JSON") from None
