"""This node's network interfaces, as facts for the topology (NodeNetworkUpdated).

`classify_interface` is pure; `probe_interfaces` reads psutil. Kinds rank transports for
ring addresses later: thunderbolt first, then ethernet/wifi, overlay (VPN, CGNAT) last.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from skulk.shared.types.common import InterfaceKind, NetworkInterface

_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def classify_interface(name: str, addresses: list[str]) -> InterfaceKind:
    lowered = name.lower()
    if lowered == "lo" or lowered.startswith("lo0") or all(_is_loopback(a) for a in addresses if a):
        return "loopback"
    if lowered.startswith(("thunderbolt", "bridge")):
        return "thunderbolt"
    if lowered.startswith(("tailscale", "utun", "wg", "tun", "zt")) or any(_in_cgnat(a) for a in addresses):
        return "overlay"
    if lowered.startswith(("wl", "wlan", "wifi")):
        return "wifi"
    if lowered.startswith(("en", "eth", "eno", "ens", "enp", "veth")):
        return "ethernet"
    return "other"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _in_cgnat(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    return ip.version == 4 and ip in _CGNAT


def probe_interfaces() -> list[NetworkInterface]:
    """IPv4 addresses per interface, sorted by name (IPv6 link-local is noise for probes)."""
    interfaces: list[NetworkInterface] = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        v4 = sorted(a.address for a in addrs if a.family == socket.AF_INET)
        if v4:
            interfaces.append(NetworkInterface(name=name, addresses=v4, kind=classify_interface(name, v4)))
    return interfaces


def listening_tcp() -> list[tuple[str, int]]:
    """(address, port) of this process's listening TCP sockets: the API and the transport's
    listeners (zenoh's default listener takes a random port). Empty where the platform
    refuses to say."""
    try:
        connections = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN and c.laddr})

