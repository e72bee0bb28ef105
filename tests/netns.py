"""Test hosts of our own: two network namespaces joined by a veth pair (addresses from the
benchmarking range 198.18.0.0/15), so traffic between "machines" never leaves the test's
own links. Skips where namespaces cannot be made (no root, no iproute2)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SUBNET = "198.18.{}.{}"


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def curl_from(namespace: str, url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
              body: str | None = None, timeout_s: float = 10) -> tuple[int, str]:
    """One HTTP request made from inside `namespace`: (status, body)."""
    args = ["ip", "netns", "exec", namespace, "curl", "-s", "-m", str(timeout_s), "-X", method,
            "-w", "\n%{http_code}"]
    for name, value in (headers or {}).items():
        args += ["-H", f"{name}: {value}"]
    if body is not None:
        args += ["-H", "content-type: application/json", "--data-binary", body]
    result = subprocess.run([*args, url], capture_output=True, text=True, timeout=timeout_s + 5)
    text, _, status = result.stdout.rpartition("\n")
    return int(status or 0), text


@pytest.fixture
def two_namespaces():
    """Yields ([namespace a, namespace b], [address a, address b]); removed at teardown."""
    if shutil.which("ip") is None or shutil.which("curl") is None:
        pytest.skip("needs iproute2 and curl")
    tag = f"{os.getpid() % 10000}"
    names = [f"skulk-a{tag}", f"skulk-b{tag}"]
    veth = [f"sk{tag}a", f"sk{tag}b"]
    created: list[str] = []
    try:
        for ns in names:
            result = ip("netns", "add", ns)
            if result.returncode != 0:
                pytest.skip(f"network namespaces unavailable here: {result.stderr.strip()}")
            created.append(ns)
        steps = [
            ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
            ("link", "set", veth[0], "netns", names[0]),
            ("link", "set", veth[1], "netns", names[1]),
        ]
        third = int(tag) % 250
        for i, ns in enumerate(names):
            address = SUBNET.format(third, i + 1)
            steps += [
                ("-n", ns, "addr", "add", f"{address}/24", "dev", veth[i]),
                ("-n", ns, "link", "set", veth[i], "up"),
                ("-n", ns, "link", "set", "lo", "up"),
                ("-n", ns, "route", "add", "224.0.0.0/4", "dev", veth[i]),
            ]
        for step in steps:
            result = ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot build the namespace link ({' '.join(step)}): {result.stderr.strip()}")
        yield names, [SUBNET.format(third, 1), SUBNET.format(third, 2)]
    finally:
        for ns in created:
            ip("netns", "del", ns)


STAR_SUBNET = "198.19.{}.{}"


class Star:
    """Namespaces each joined by a veth pair to one bridge in a hub namespace: a switch with
    one cable per host. `cut(i)` unplugs host i's cable (its link goes down on the switch
    side; the host keeps running and keeps its address), `heal(i)` plugs it back."""

    UPLINK_HOST = 254

    def __init__(self, tag: str, count: int, *, uplink: bool = False) -> None:
        self.uplink = uplink
        """Also plug this (the test's own) namespace into the switch, at `uplink_address`, so
        the test process reaches the hosts' addresses directly (clients, probes)."""
        self.hub = f"skulk-h{tag}"
        self.names = [f"skulk-s{i}-{tag}" for i in range(count)]
        self.third = int(tag) % 250
        self.addresses = [STAR_SUBNET.format(self.third, i + 1) for i in range(count)]
        self._switch_ports = [f"sk{tag}h{i}" for i in range(count)]
        self._host_ports = [f"sk{tag}n{i}" for i in range(count)]
        self.uplink_address = STAR_SUBNET.format(self.third, self.UPLINK_HOST)
        self._uplink_ports = (f"sk{tag}u", f"sk{tag}v")  # (this namespace's end, the switch's end)

    def _steps(self) -> list[tuple[str, ...]]:
        steps: list[tuple[str, ...]] = [
            ("-n", self.hub, "link", "add", "br0", "type", "bridge"),
            ("-n", self.hub, "link", "set", "br0", "up"),
        ]
        for ns, host, switch, address in zip(self.names, self._host_ports, self._switch_ports, self.addresses,
                                             strict=True):
            steps += [
                ("link", "add", host, "type", "veth", "peer", "name", switch),
                ("link", "set", host, "netns", ns),
                ("link", "set", switch, "netns", self.hub),
                ("-n", self.hub, "link", "set", switch, "master", "br0"),
                ("-n", self.hub, "link", "set", switch, "up"),
                ("-n", ns, "addr", "add", f"{address}/24", "dev", host),
                ("-n", ns, "link", "set", host, "up"),
                ("-n", ns, "link", "set", "lo", "up"),
            ]
        if self.uplink:  # removed with the hub: deleting one end of a veth pair deletes both
            mine, switch = self._uplink_ports
            steps += [
                ("link", "add", mine, "type", "veth", "peer", "name", switch),
                ("link", "set", switch, "netns", self.hub),
                ("-n", self.hub, "link", "set", switch, "master", "br0"),
                ("-n", self.hub, "link", "set", switch, "up"),
                ("addr", "add", f"{self.uplink_address}/24", "dev", mine),
                ("link", "set", mine, "up"),
            ]
        return steps

    def cut(self, index: int) -> None:
        result = ip("-n", self.hub, "link", "set", self._switch_ports[index], "down")
        assert result.returncode == 0, result.stderr

    def heal(self, index: int) -> None:
        result = ip("-n", self.hub, "link", "set", self._switch_ports[index], "up")
        assert result.returncode == 0, result.stderr


def build_star(count: int, *, uplink: bool = False) -> tuple[Star | None, str, list[str]]:
    """(the star, "", namespaces created) or (None, why not, namespaces created so far):
    the caller removes what was created (`remove_namespaces`) whatever happened."""
    if shutil.which("ip") is None or shutil.which("curl") is None:
        return None, "needs iproute2 and curl", []
    star = Star(f"{os.getpid() % 10000}", count, uplink=uplink)
    created: list[str] = []
    for ns in [star.hub, *star.names]:
        result = ip("netns", "add", ns)
        if result.returncode != 0:
            return None, f"network namespaces unavailable here: {result.stderr.strip()}", created
        created.append(ns)
    for step in star._steps():
        result = ip(*step)
        if result.returncode != 0:
            return None, f"cannot build the namespace star ({' '.join(step)}): {result.stderr.strip()}", created
    return star, "", created


def remove_namespaces(names: list[str]) -> None:
    for ns in names:
        ip("netns", "del", ns)


@pytest.fixture
def three_namespaces():
    """A `Star` of three namespaces (removed at teardown); skips where namespaces cannot be
    made (no root, no iproute2), saying why."""
    star, why, created = build_star(3)
    try:
        if star is None:
            pytest.skip(why)
        yield star
    finally:
        remove_namespaces(created)
