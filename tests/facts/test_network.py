import pytest

from skulk.facts.network import classify_interface, probe_interfaces


@pytest.mark.parametrize(
    ("name", "addresses", "kind"),
    [
        ("lo", ["127.0.0.1"], "loopback"),
        ("lo0", ["127.0.0.1"], "loopback"),
        ("eth0", ["10.0.0.2"], "ethernet"),
        ("enp3s0", ["192.168.1.4"], "ethernet"),
        ("en0", ["192.168.1.4"], "ethernet"),
        ("wlan0", ["192.168.1.9"], "wifi"),
        ("bridge0", ["169.254.3.1"], "thunderbolt"),
        ("thunderbolt0", ["10.9.0.1"], "thunderbolt"),
        ("tailscale0", ["100.101.102.103"], "overlay"),
        ("utun3", ["10.2.0.1"], "overlay"),
        ("eth1", ["100.64.1.2"], "overlay"),  # CGNAT range = an overlay network
        ("docker0", ["172.17.0.1"], "other"),
    ],
)
def test_classify_interface(name, addresses, kind):
    assert classify_interface(name, addresses) == kind


def test_probe_interfaces_reports_loopback():
    interfaces = probe_interfaces()
    assert any(i.kind == "loopback" and "127.0.0.1" in i.addresses for i in interfaces)
