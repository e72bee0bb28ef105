"""Cluster diagnostics and capture bundles on three real node processes, one of them
killed with SIGKILL: the asking node lists it as unreachable (with why) and still reports,
and the capture archive holds the two live nodes' flight recorders, logs, configuration
(no secret in it) and versions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile

import httpx
import pytest

from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(240)

KEY = "capture-test-cluster-key"
GATHER_DEADLINE_S = 30.0
"""Hang guard of one cluster-wide request (each member answers within its own 4 s deadline)."""


def ask(node, path: str) -> httpx.Response:
    return httpx.get(node.url + path, timeout=GATHER_DEADLINE_S)


def test_cluster_diagnostics_and_capture_list_a_killed_node_as_unreachable(spawn_node, tmp_path):
    nodes = start_linked(spawn_node, ["cap-a", "cap-b", "cap-c"], key=KEY, extra_args=("--no-worker",))
    wait_agreed(nodes, members=3)
    ids = [node_id(n) for n in nodes]
    asker, _, victim = nodes

    report = ask(asker, "/v1/diagnostics/cluster").json()
    assert report["unreachable"] == []
    assert set(report["nodes"]) == set(ids)
    for nid in ids:
        entry = report["nodes"][nid]
        assert entry["reachable"] and entry["diagnostics"]["nodeId"] == nid
        assert entry["diagnostics"]["flightRecorder"]["size"] > 0
    assert report["versions"]["skew"] is False and len(report["versions"]["distinct"]) == 1
    one = ask(asker, f"/v1/diagnostics/cluster/{ids[2]}")
    assert one.status_code == 200 and one.json()["nodeId"] == ids[2]
    assert asker.get("/v1/diagnostics/cluster/no-such-node").status_code == 404

    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)

    def victim_unreachable():
        body = ask(asker, "/v1/diagnostics/cluster").json()
        return body if body["unreachable"] == [ids[2]] else None

    report = wait_for(victim_unreachable, timeout_s=30, what="the killed node listed unreachable")
    assert report["nodes"][ids[2]]["reachable"] is False and report["nodes"][ids[2]]["error"]
    timeline = ask(asker, "/v1/diagnostics/cluster/timeline").json()
    assert timeline["unreachable"] == [ids[2]] and {r["nodeId"] for r in timeline["records"]} == set(ids[:2])
    assert [r["at"] for r in timeline["records"]] == sorted(r["at"] for r in timeline["records"])
    missing = ask(asker, f"/v1/diagnostics/cluster/{ids[2]}")
    assert missing.status_code == 502 and "peer_unreachable" in missing.text

    archive_path = tmp_path / "capture.tar.gz"
    result = subprocess.run(
        [sys.executable, "-m", "skulk", "diagnostics", "capture", "-o", str(archive_path), "--url", asker.url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"unreachable: {ids[2]}" in result.stdout

    with tarfile.open(archive_path) as archive:
        files = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    manifest = json.loads(next(v for k, v in files.items() if k.endswith("/manifest.json")))
    assert manifest["unreachable"] == [ids[2]]
    assert manifest["askedNode"] == ids[0]
    for live in ids[:2]:
        folder = manifest["nodes"][live]["folder"]
        recorder = json.loads(next(v for k, v in files.items() if k.endswith(f"{folder}/flight-recorder.json")))
        kinds = {r["kind"] for r in recorder["records"]}
        assert {"event", "election"} <= kinds
        assert any(k.endswith(f"{folder}/recent-logs.txt") for k in files)
        config = json.loads(next(v for k, v in files.items() if k.endswith(f"{folder}/config.json")))
        assert config["cluster_key"] == "<redacted>"
        assert json.loads(next(v for k, v in files.items() if k.endswith(f"{folder}/versions.json")))["skulk"]
    assert any(k.endswith(f"{manifest['nodes'][ids[2]]['folder']}/UNREACHABLE.txt") for k in files)
    assert any(k.endswith("/state.json") for k in files)
    timeline = json.loads(next(v for k, v in files.items() if k.endswith("/timeline.json")))
    assert {r["nodeId"] for r in timeline} == set(ids[:2])
    assert not any(KEY.encode() in content for content in files.values()), "the cluster key leaked into the capture"
