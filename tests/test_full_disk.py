"""A real node on a real full disk (a small tmpfs as its data dir): it keeps serving and its
lease keeps renewing (it used to self-fence and exit 4 on ENOSPC), and it starts again on the
full disk in degraded mode, with nodeHealth saying the disk is full."""

from __future__ import annotations

import json

import pytest

from skulk.datadir.lease import read_lease
from tests.fulldisk import fill, small_disk
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(180)


def _health_reasons(node) -> dict[str, str]:
    state = node.get("/state").json()
    return {r["code"]: r["message"] for h in state.get("nodeHealth", {}).values() for r in h.get("reasons", [])}


def test_a_node_keeps_serving_on_a_full_disk_and_restarts_on_it_degraded(spawn_node, tmp_path) -> None:
    with small_disk(tmp_path / "disk", size="64m") as disk:
        env = {"SKULK_MODELS_DIR": str(disk / "models")}
        node = spawn_node("full", data_dir=disk / "data", env=env).wait_ready()
        wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=60, what="a master")
        fill(disk)
        lease_path = disk / "data" / "skulk.lease"
        first = read_lease(lease_path)
        assert first is not None
        # Two renewals on the full disk (every 5 s): the lease's expiry moves on, the node serves.
        wait_for(lambda: (r := read_lease(lease_path)) is not None and r.expires_at >= first.expires_at + 9,
                 timeout_s=60, interval_s=0.5, what="two lease renewals on the full disk")
        assert node.proc.poll() is None, node.log()[-3000:]
        assert node.get("/v1/cluster").status_code == 200
        wait_for(lambda: "disk_full" in _health_reasons(node), timeout_s=30, interval_s=0.5,
                 what="nodeHealth saying the disk is full")

        node.stop()
        assert node.proc.returncode == 0, node.log()[-3000:]
        again = spawn_node("full-again", data_dir=disk / "data", env=env).wait_ready()
        wait_for(lambda: again.get("/v1/cluster").json().get("masterNodeId"), timeout_s=60, what="a master")
        wait_for(lambda: "disk_full" in _health_reasons(again), timeout_s=30, interval_s=0.5,
                 what="nodeHealth saying the disk is full after the restart")
        assert "every download to it is refused" in _health_reasons(again)["disk_full"]
        diagnostics = again.get("/v1/diagnostics/node").json()
        assert diagnostics["eventLog"]["mode"] == "counting_only"
        print("\nrestarted on a full disk; event log:", json.dumps(diagnostics.get("eventLog"))[:300])
        assert again.proc.poll() is None
        again.stop()
        assert again.proc.returncode == 0, again.log()[-3000:]
