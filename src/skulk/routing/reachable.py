"""Where another machine can reach this node: the endpoints a join token carries.

A node usually binds its API and transport to every interface (`0.0.0.0`, zenoh's default
listener on a random port); a token needs addresses a new machine can dial. Wildcards expand
to this machine's interface addresses, best first (wired and Thunderbolt, then Wi-Fi, then
overlays and the rest); loopback only when the node is bound to it or has nothing else.
Pure: the node passes in its interfaces and listening sockets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Final

from skulk.shared.types.common import NetworkInterface

_RANK: Final = {"ethernet": 0, "thunderbolt": 0, "wifi": 1, "overlay": 2, "other": 3, "loopback": 9}
_WILDCARDS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})
LOOPBACK: Final = "127.0.0.1"


def advertised_addresses(interfaces: Sequence[NetworkInterface]) -> list[str]:
    """Non-loopback, non-link-local addresses, best interface kind first; loopback when none."""
    ranked: list[tuple[int, str]] = []
    for interface in interfaces:
        for address in interface.addresses:
            try:
                ip = ipaddress.ip_address(address.split("%")[0])
            except ValueError:
                continue
            if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
                continue
            ranked.append((_RANK.get(interface.kind, 3), address))
    seen: dict[str, None] = {}
    for _, address in sorted(ranked, key=lambda pair: pair[0]):
        seen.setdefault(address, None)
    return list(seen) or [LOOPBACK]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _hosts(bound: str, addresses: Sequence[str]) -> list[str]:
    return list(addresses) if bound in _WILDCARDS else [bound.strip("[]")]


def api_urls(api_host: str, api_port: int, addresses: Sequence[str], scheme: str = "http") -> list[str]:
    """The URLs of this node's API (`api_host` as bound, wildcard expanded)."""
    return [f"{scheme}://{_host(h)}:{api_port}" for h in _hosts(api_host, addresses)]


def _split_locator(locator: str) -> tuple[str, str, str] | None:
    """`tcp/1.2.3.4:7447` -> ("tcp", "1.2.3.4", "7447"); None for what is not host:port."""
    protocol, sep, rest = locator.partition("/")
    rest = rest.split("#")[0].split("?")[0]
    host, colon, port = rest.rpartition(":")
    if not sep or not colon or not port.isdigit():
        return None
    return protocol, host, port


def transport_endpoints(
    listen: Sequence[str], listening: Sequence[tuple[str, int]], api_port: int, addresses: Sequence[str],
) -> list[str]:
    """The transport locators peers can dial: the configured `listen` endpoints, or (none
    configured: zenoh chose a port) this process's listening TCP sockets other than the API."""
    found: list[str] = []
    if listen:
        for locator in listen:
            parts = _split_locator(locator)
            if parts is None:
                continue
            protocol, host, port = parts
            found.extend(f"{protocol}/{_host(h)}:{port}" for h in _hosts(host, addresses))
    else:
        for host, port in listening:
            if port != api_port:
                found.extend(f"tcp/{_host(h)}:{port}" for h in _hosts(host, addresses))
    return list(dict.fromkeys(found))


__all__ = ["advertised_addresses", "api_urls", "transport_endpoints"]
