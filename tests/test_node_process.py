"""One real `skulk run` process: lease, API, clean shutdown."""

import signal
import subprocess

import httpx
import pytest

from skulk.datadir.lease import read_lease
from tests.nodeproc import wait_for

HANG_GUARD_S = 90.0
"""How long a signalled node may take to exit before the test fails as hung (no speed bound)."""


def test_node_serves_node_id_and_state(spawn_node):
    node = spawn_node("a").wait_ready()
    node_id = node.get("/node_id").json()["nodeId"]
    assert node_id
    state = node.get("/state").json()
    assert state["lastEventAppliedIdx"] == -1
    assert "nodeHealth" in state and "instances" in state


def test_second_node_on_same_data_dir_exits_naming_the_first(spawn_node, tmp_path):
    first = spawn_node("a").wait_ready()
    second = spawn_node("b", data_dir=first.data_dir)
    code = second.wait_exit(timeout_s=60)
    assert code == 3
    log = second.log()
    assert f"pid {first.proc.pid}" in log
    assert f"127.0.0.1:{first.api_port}" in log
    # The first node is untouched by the attempt.
    assert first.get("/node_id").status_code == 200


def test_sigterm_and_sigint_shut_down_cleanly(spawn_node):
    for sig in (signal.SIGTERM, signal.SIGINT):
        node = spawn_node(f"n{sig}").wait_ready()
        node.signal(sig)
        # Exit code 0: the node shut down by itself (a kill would leave a negative code);
        # the long wait is a hang guard, not a speed bound.
        try:
            code = node.wait_exit(timeout_s=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hung: the node did not exit within {HANG_GUARD_S:g}s of {sig!r}\n{node.log()[-4000:]}")
        assert code == 0
        released = read_lease(node.data_dir / "skulk.lease")  # expired in place (keeps its blocks)
        assert released is None or released.expires_at == 0.0, "lease must be released on clean shutdown"
        # The live event log was archived on close.
        assert "stopped" in node.log()


def test_restart_on_same_data_dir_after_kill(spawn_node):
    first = spawn_node("a").wait_ready()
    first.proc.kill()
    first.proc.wait(timeout=10)
    again = spawn_node("a2", data_dir=first.data_dir, port=first.api_port).wait_ready()
    assert again.get("/node_id").status_code == 200
    # Taken over because the holder died (or, on a slow machine, because its lease expired).
    assert "took over lease" in again.log()


def test_bad_config_exits_with_usage_error_naming_key(spawn_node, tmp_path):
    data_dir = tmp_path / "bad"
    data_dir.mkdir()
    (data_dir / "skulk.yaml").write_text("node:\n  api_prot: 1\n")
    node = spawn_node("bad", data_dir=data_dir)
    assert node.wait_exit(timeout_s=60) == 2
    assert "unknown key 'node.api_prot'" in node.log()


def test_node_on_a_full_disk_keeps_serving(spawn_node, tmp_path):
    """A data dir on a tiny filesystem: the event log degrades to counting-only, the node serves.

    Indices keep advancing: the node's master indexes a command though nothing is written."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        node = spawn_node("full", data_dir=mount_point / "data").wait_ready()
        # Fill what is left of the filesystem.
        with open(mount_point / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
            except OSError:
                pass
        diagnostics = node.get("/v1/diagnostics/node").json()
        assert diagnostics["eventLog"]["mode"] == "counting_only"
        assert diagnostics["eventLog"]["degradedReason"].startswith("free-space floor")
        # The node elects itself and keeps indexing: indices advance though nothing is written.
        wait_for(lambda: node.get("/v1/cluster").json()["masterNodeId"], timeout_s=30, what="a master")
        before = node.get("/v1/cluster").json()["lastEventIdx"]
        assert httpx.put(node.url + "/v1/tracing", json={"enabled": True}, timeout=5).status_code == 202
        wait_for(lambda: node.get("/v1/cluster").json()["lastEventIdx"] > before, timeout_s=20, what="index advance")
        log_stats = node.get("/v1/diagnostics/node").json()["eventLog"]
        assert log_stats["recordsCountedOnly"] > 0
        assert node.get("/state").json()["tracingEnabled"] is True
        node.signal(signal.SIGTERM)
        assert node.wait_exit(timeout_s=10) == 0
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
