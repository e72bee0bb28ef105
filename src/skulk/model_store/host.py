"""Which node's model store this node stages from.

One rule chain, pure, so the precedence is a table test:

1. an explicit `model_store.store_host` in skulk.yaml wins (an operator who names the store
   on every node means it, whatever the election says);
2. otherwise the store the elected master advertises (its state-sync answer carries its
   routable store address), so independently installed nodes converge on one source of
   truth;
3. otherwise, inside the startup window (no master heard yet this session), the store the
   master advertised before the restart (`store_memory.py` persists it): a restarted
   follower keeps its authoritative store instead of briefly becoming a store of its own;
4. otherwise this node is its own bootstrap store: a fresh single node works at once.

The store rides the node API, so a store address is an API base URL. This module never
opens a socket; the shell re-runs `choose_store` when the master or the config changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

StoreSource = Literal["explicit", "master", "remembered", "bootstrap"]


class StoreAddressError(ValueError):
    """A `store_host` setting that is not `host`, `host:port` or an http(s) URL."""

    def __init__(self, value: str, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid store_host {value!r}: {reason}")


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int
    scheme: Literal["http", "https"] = "http"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class StoreChoice:
    address: StoreAddress
    source: StoreSource
    is_self: bool
    """This node hosts the store: stage by hardlink, serve the canonical copy."""


def parse_store_address(value: str, default_port: int) -> StoreAddress:
    """`host`, `host:port`, `[v6]:port` or `http(s)://host[:port]` -> StoreAddress."""
    text = value.strip()
    if not text:
        raise StoreAddressError(value, "it is empty")
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme not in ("http", "https"):
        raise StoreAddressError(value, f"scheme {parts.scheme!r} is not http or https")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise StoreAddressError(value, "it must name a host (and port) only, no path")
    try:
        port = parts.port
    except ValueError as exc:
        raise StoreAddressError(value, str(exc)) from None
    if not parts.hostname:
        raise StoreAddressError(value, "it names no host")
    scheme: Literal["http", "https"] = "https" if parts.scheme == "https" else "http"
    return StoreAddress(parts.hostname, port if port is not None else default_port, scheme)


def advertised_store(api_endpoint: str | None) -> StoreAddress | None:
    """The store a node advertises: its API endpoint (`NodeResources.api_endpoint`), since
    the store rides the node API. None for a node without an API or a malformed endpoint."""
    if not api_endpoint:
        return None
    try:
        return parse_store_address(api_endpoint, 443 if api_endpoint.startswith("https://") else 80)
    except StoreAddressError:
        return None


def choose_store(
    explicit: StoreAddress | None,
    master_store: StoreAddress | None,
    own: StoreAddress,
    own_hosts: frozenset[str] = frozenset(),
    remembered: StoreAddress | None = None,
) -> StoreChoice:
    """The store to use, first rule that applies wins. `own_hosts` are the other names this
    node answers to (its addresses, 'localhost'), so an explicit or advertised store that
    is this very node is recognised as such. `remembered` is the persisted master store; the
    shell passes it only until a master is heard."""
    for source, address in (("explicit", explicit), ("master", master_store), ("remembered", remembered)):
        if address is not None:
            return StoreChoice(address, source, _is_self(address, own, own_hosts))  # type: ignore[arg-type]
    return StoreChoice(own, "bootstrap", True)


def _is_self(address: StoreAddress, own: StoreAddress, own_hosts: frozenset[str]) -> bool:
    return address.port == own.port and (address.host == own.host or address.host in own_hosts)


__all__ = [
    "StoreAddress",
    "StoreAddressError",
    "StoreChoice",
    "StoreSource",
    "advertised_store",
    "choose_store",
    "parse_store_address",
]
