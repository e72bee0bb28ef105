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
