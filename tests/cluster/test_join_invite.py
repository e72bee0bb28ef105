"""Join with one line, on real nodes: `skulk cluster invite` on the first node prints a
token; a second node with its own data dir, no key and no peers joins with `--join-file`
alone, keeps the key and rejoins after a restart with nothing typed; a reused, an expired,
an edited and an unknown token are each refused with their reason and leave nothing behind;
the token is in no log, no State and no data dir."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.cluster.harness import wait_agreed
from tests.nodeproc import free_port, wait_for

pytestmark = pytest.mark.timeout(300)


def _skulk(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skulk", *args], capture_output=True, text=True, input=stdin,
                          timeout=timeout, env={k: v for k, v in __import__("os").environ.items()
                                                if not k.startswith("SKULK_")})


def _join_refused(tmp_path, name: str, token: str) -> str:
    """Run `skulk run --join -` with `token` on stdin; it must refuse and leave no key."""
    data_dir = tmp_path / name
    result = _skulk("run", "--data-dir", str(data_dir), "--api-port", str(free_port()), "--api-host", "127.0.0.1",
                    "--no-multicast", "--join", "-", stdin=token + "\n")
    assert result.returncode == 2, result.stderr
    assert not (data_dir / "cluster.key").exists()
    assert token not in result.stderr
    return result.stderr


def _edited(token: str, **fields) -> str:
    prefix, body = token[:len("skulk-join1-")], token[len("skulk-join1-"):]
    decoded = json.loads(base64.urlsafe_b64decode(body + "=="))
    decoded.update(fields)
    return prefix + base64.urlsafe_b64encode(json.dumps(decoded).encode()).decode().rstrip("=")


def _tree_text(path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in path.rglob("*") if p.is_file())


def test_a_node_joins_with_a_token_alone(spawn_node, tmp_path):
    transport = free_port()
    alpha = spawn_node("alpha", extra_args=["--listen", f"tcp/127.0.0.1:{transport}", "--node-name", "alpha"])
    alpha.wait_ready()

    invite = _skulk("cluster", "invite", "--url", alpha.url, "--expires", "10m")
    assert invite.returncode == 0, invite.stderr
    token = invite.stdout.strip().splitlines()[-1]
    assert token.startswith("skulk-join1-") and "one machine may join" in invite.stdout
    assert f"tcp/127.0.0.1:{transport}" in invite.stdout
    token_file = tmp_path / "join-token"
    token_file.write_text(token + "\n")

    beta = spawn_node("beta", extra_args=["--join-file", str(token_file), "--node-name", "beta"])
    beta.wait_ready()
    wait_agreed([alpha, beta], members=2)
    alpha_key = (alpha.data_dir / "cluster.key").read_text().strip()
    assert (beta.data_dir / "cluster.key").read_text().strip() == alpha_key
    assert json.loads((beta.data_dir / "joined.json").read_text())["bootstrapPeers"] == [f"tcp/127.0.0.1:{transport}"]
    assert "node 'beta' joined through invite" in alpha.log()

    # Nothing typed on a restart: the key and the peers are the data dir's.
    beta.stop()
    beta.extra_args = ["--node-name", "beta"]
    beta.start().wait_ready()
    wait_agreed([alpha, beta], members=2)

    assert "already used" in _join_refused(tmp_path, "gamma", token)
    fresh = httpx.post(alpha.url + "/v1/cluster/invites", json={}, timeout=10).json()["token"]
    assert "edited after it was issued" in _join_refused(tmp_path, "delta", _edited(fresh, p=["tcp/10.9.9.9:1"]))
    assert "does not know this invite" in _join_refused(tmp_path, "epsilon", _edited(token, i="AAAAAAAAAAAAAAAAAAAAAA"))
    assert "not a Skulk join token" in _join_refused(tmp_path, "zeta", token[: len(token) // 2])

    short = httpx.post(alpha.url + "/v1/cluster/invites", json={"ttlSeconds": 1}, timeout=10).json()
    wait_for(lambda: time.time() > short["expiresAt"] + 0.5, timeout_s=10, what="the invite's expiry")
    assert "expired" in _join_refused(tmp_path, "eta", short["token"])

    state = json.dumps(alpha.get("/state").json())
    for text in (alpha.log(), beta.log(), state, _tree_text(alpha.data_dir), _tree_text(beta.data_dir)):
        assert token not in text and short["token"] not in text and fresh not in text


def test_a_join_with_a_cluster_key_is_refused(tmp_path):
    result = _skulk("run", "--data-dir", str(tmp_path / "n"), "--join", "skulk-join1-x", "--cluster-key", "k")
    assert result.returncode == 2 and "do not give --cluster-key" in result.stderr
