"""Which endpoints a join token carries: wildcards expand to the best interface addresses;
a bound address stays; loopback only when bound there or nothing else (pure, table-driven)."""

from __future__ import annotations

import pytest

from skulk.routing.reachable import advertised_addresses, api_urls, transport_endpoints
from skulk.shared.types.common import NetworkInterface

IFACES = [
    NetworkInterface(name="docker0", addresses=["172.17.0.1"], kind="other"),
    NetworkInterface(name="lo", addresses=["127.0.0.1"], kind="loopback"),
    NetworkInterface(name="tailscale0", addresses=["100.64.0.7"], kind="overlay"),
    NetworkInterface(name="wlan0", addresses=["192.168.1.20"], kind="wifi"),
    NetworkInterface(name="eth0", addresses=["10.0.0.5", "fe80::1"], kind="ethernet"),
]
ADDRS = ["10.0.0.5", "192.168.1.20"]


def test_addresses_rank_wired_first_and_skip_loopback_and_link_local():
    assert advertised_addresses(IFACES) == ["10.0.0.5", "192.168.1.20", "100.64.0.7", "172.17.0.1"]
    assert advertised_addresses([IFACES[1]]) == ["127.0.0.1"]


@pytest.mark.parametrize(("host", "expected"), [
    ("0.0.0.0", ["http://10.0.0.5:52415", "http://192.168.1.20:52415"]),
    ("127.0.0.1", ["http://127.0.0.1:52415"]),
    ("10.0.0.9", ["http://10.0.0.9:52415"]),
    ("::1", ["http://[::1]:52415"]),
])
def test_api_urls(host, expected):
    assert api_urls(host, 52415, ADDRS) == expected


@pytest.mark.parametrize(("listen", "listening", "expected"), [
    (["tcp/127.0.0.1:7447"], [], ["tcp/127.0.0.1:7447"]),
    (["tcp/0.0.0.0:7447"], [], ["tcp/10.0.0.5:7447", "tcp/192.168.1.20:7447"]),
    (["tcp/[::]:7447", "tcp/0.0.0.0:7447"], [], ["tcp/10.0.0.5:7447", "tcp/192.168.1.20:7447"]),
    (["not-a-locator"], [], []),
    ([], [("0.0.0.0", 52415), ("::", 40111), ("0.0.0.0", 40111)], ["tcp/10.0.0.5:40111", "tcp/192.168.1.20:40111"]),
    ([], [("127.0.0.1", 40111)], ["tcp/127.0.0.1:40111"]),
])
def test_transport_endpoints(listen, listening, expected):
    assert transport_endpoints(listen, listening, 52415, ADDRS) == expected
