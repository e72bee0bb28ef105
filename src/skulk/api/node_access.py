"""The node's access policy built from its settings (see `skulk.api.access` for the rules).

`with_api_key` is the one step with a side effect: a node with no configured key uses the
one in its data dir, created on first start (mode 0600) and printed by `skulk api-key`.
The rest is pure: the policy, the `Host` names the node answers to, and the warnings an
operator sees at start when the API is opened wider than the secure default.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from skulk.api.access import AccessPolicy, own_hosts
from skulk.datadir.secret_file import load_or_create_secret

if TYPE_CHECKING:
    from skulk.datadir.paths import SkulkPaths
    from skulk.node_settings import NodeSettings
    from skulk.shared.types.common import NetworkInterface


def load_or_create_api_key(paths: SkulkPaths) -> str:
    """The node's own API key (`<data dir>/api.key`), created on first use."""
    key, _created = load_or_create_secret(paths.api_key_file, "API key")
    return key


def with_api_key(settings: NodeSettings) -> NodeSettings:
    """`settings` with an API key: the configured one, else the data dir's."""
    if settings.api_key or settings.open_to_lan:
        return settings
    return dataclasses.replace(settings, api_key=load_or_create_api_key(settings.paths))


def access_policy(settings: NodeSettings, peer_token: str | None) -> AccessPolicy:
    """The policy before the node knows its addresses (`with_own_hosts` adds them)."""
    return AccessPolicy(
        api_key=settings.api_key or None,
        operator_key=settings.operator_key or None,
        peer_token=peer_token,
        require_key_on_loopback=settings.require_key_on_loopback,
        open_to_lan=settings.open_to_lan,
        allowed_hosts=own_hosts(_host_names(settings), (), settings.allowed_hosts),
    )


def _host_names(settings: NodeSettings) -> list[str]:
    names = [settings.api_host]
    for lookup in (socket.gethostname, socket.getfqdn):
        try:
            names.append(lookup())
        except OSError:
            continue
    return names


def with_own_hosts(
    policy: AccessPolicy | None, settings: NodeSettings, interfaces: Iterable[NetworkInterface]
) -> AccessPolicy | None:
    """`policy` whose Host check also accepts every address of this node's interfaces."""
    if policy is None:
        return None
    addresses = [address for interface in interfaces for address in interface.addresses]
    hosts = own_hosts(_host_names(settings), addresses, settings.allowed_hosts)
    return dataclasses.replace(policy, allowed_hosts=hosts | (policy.allowed_hosts or frozenset()))


def _is_loopback_bind(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def access_warnings(settings: NodeSettings) -> list[str]:
    """What an operator must hear at start about how open this node's API is."""
    warnings = []
    if settings.open_to_lan and not _is_loopback_bind(settings.api_host):
        warnings.append(f"api.open_to_lan is on: anyone who can reach {settings.api_host}:{settings.api_port} can "
                        "use and change this cluster without a key. Turn it off to require the API key.")
    if "*" in settings.allowed_hosts:
        warnings.append("api.allowed_hosts contains '*': the Host header is not checked, so a web page can reach "
                        "this node's API through DNS rebinding.")
    return warnings


__all__ = ["access_policy", "access_warnings", "load_or_create_api_key", "with_api_key", "with_own_hosts"]
