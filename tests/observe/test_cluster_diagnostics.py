"""The cluster report, version skew, peer addressing, secret redaction and the capture
archive's layout: pure functions over hand-built data."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from skulk.datadir.paths import resolve_paths
from skulk.node_settings import NodeSettings
from skulk.observe.capture import capture_files, write_archive
from skulk.observe.cluster_diagnostics import PeerAnswer, cluster_report, cluster_timeline, version_report
from skulk.observe.node_report import REDACTED, redacted_config
from skulk.observe.peer_http import peer_api_urls, peer_headers
from skulk.shared.types.state import NodeInfo, State


def state_of(*nodes: tuple[str, str, str | None]) -> State:
    return State(nodes={n: NodeInfo(node_id=n, node_name=f"name-{n}", version=v, api_endpoint=url)
                        for n, v, url in nodes})


@pytest.mark.parametrize(("versions", "distinct", "skew"), [
    ({"a": "1.0", "b": "1.0"}, ["1.0"], False),
    ({"a": "1.0", "b": "1.1"}, ["1.0", "1.1"], True),
    ({"a": "1.0", "b": None}, ["1.0"], False),
    ({}, [], False),
])
def test_version_skew(versions, distinct, skew):
    report = version_report(versions)
    assert (report["distinct"], report["skew"]) == (distinct, skew)


@pytest.mark.parametrize(("verified", "expected"), [
    ({}, {"b": "http://b:1", "c": None}),
    ({"b": "http://10.0.0.2:1/"}, {"b": "http://10.0.0.2:1", "c": None}),
    ({"c": "http://c:9"}, {"b": "http://b:1", "c": "http://c:9"}),
])
def test_peer_urls_prefer_verified_addresses_and_skip_me(verified, expected):
    state = state_of(("a", "1", "http://a:1"), ("b", "1", "http://b:1/"), ("c", "1", None))
    assert peer_api_urls(state, verified, "a") == expected


@pytest.mark.parametrize(("key", "headers"), [(None, {}), ("", {}), ("k", {"Authorization": "Bearer k"})])
def test_peer_headers(key, headers):
    assert peer_headers(key) == headers


def test_cluster_report_lists_answers_and_unreachable_members_with_versions():
    state = state_of(("a", "1.0", "http://a"), ("b", "1.0", "http://b"), ("c", "0.9", "http://c"))
    answers = {"b": PeerAnswer(body={"nodeId": "b", "version": "1.0"}), "c": PeerAnswer(error="http://c: refused")}
    report = cluster_report("a", {"nodeId": "a", "nodeName": "me", "version": "1.0"}, answers, state)
    assert report["unreachable"] == ["c"]
    assert report["nodes"]["a"]["diagnostics"]["nodeName"] == "me"
    assert report["nodes"]["b"] == {"nodeId": "b", "name": "name-b", "reachable": True,
                                    "diagnostics": {"nodeId": "b", "version": "1.0"}}
    assert report["nodes"]["c"] == {"nodeId": "c", "name": "name-c", "reachable": False, "error": "http://c: refused"}
    # The unreachable member's version comes from State: a skew is still visible.
    assert report["versions"]["byNode"] == {"a": "1.0", "b": "1.0", "c": "0.9"}
    assert report["versions"]["skew"] is True


def test_redacted_config_never_holds_a_secret(tmp_path):
    paths = resolve_paths({}, "linux", tmp_path, tmp_path / "data")
    settings = NodeSettings(paths=paths, node_name="n", cluster_key="s3cret-cluster", api_key="s3cret-api")
    config = redacted_config(settings)
    assert config["cluster_key"] == REDACTED and config["api_key"] == REDACTED
    assert config["node_name"] == "n" and config["model_store"]["disk_reserve_gb"] == 10.0
    assert "s3cret" not in json.dumps(config)
    assert redacted_config(NodeSettings(paths=paths, node_name="n"))["cluster_key"] is None


def test_capture_layout_and_archive(tmp_path: Path):
    report = {
        "nodeId": "a",
        "unreachable": ["c"],
        "versions": {"skew": False},
        "nodes": {
            "a": {"name": "alpha/1", "reachable": True, "diagnostics": {
                "nodeId": "a", "flightRecorder": {"records": [{"kind": "event"}]}, "recentLogs": ["l1", "l2"],
                "config": {"cluster_key": REDACTED}, "versions": {"skulk": "0.1"}, "streams": {"openStreams": 0}}},
            "c": {"name": "gamma", "reachable": False, "error": "refused"},
        },
    }
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    files = capture_files(report, {"nodes": {}}, {"nodeId": "a"}, asked_url="http://a", created_at=created)
    root = "skulk-capture-20260102T030405Z"
    assert set(files) == {
        f"{root}/manifest.json", f"{root}/state.json", f"{root}/cluster.json", f"{root}/timeline.json",
        f"{root}/nodes/a-alpha_1/flight-recorder.json", f"{root}/nodes/a-alpha_1/recent-logs.txt",
        f"{root}/nodes/a-alpha_1/config.json", f"{root}/nodes/a-alpha_1/versions.json",
        f"{root}/nodes/a-alpha_1/diagnostics.json", f"{root}/nodes/c-gamma/UNREACHABLE.txt",
    }
    manifest = json.loads(files[f"{root}/manifest.json"])
    assert manifest["unreachable"] == ["c"] and manifest["nodes"]["c"]["error"] == "refused"
    assert json.loads(files[f"{root}/nodes/a-alpha_1/diagnostics.json"]) == {"nodeId": "a",
                                                                             "streams": {"openStreams": 0}}
    out = tmp_path / "c.tar.gz"
    write_archive(files, out)
    with tarfile.open(out) as archive:
        assert sorted(archive.getnames()) == sorted(files)
        assert archive.extractfile(f"{root}/nodes/a-alpha_1/recent-logs.txt").read() == b"l1\nl2\n"
    assert not (tmp_path / "c.tar.gz.partial").exists()
    assert io.BytesIO(out.read_bytes()).read(2) == b"\x1f\x8b"


def test_the_timeline_merges_reachable_recorders_in_time_order():
    def recorder(*ats):
        return {"reachable": True, "diagnostics": {"flightRecorder": {"records": [{"at": a, "kind": "event"} for a in ats]}}}

    report = {"nodes": {"a": recorder(1.0, 4.0), "b": recorder(2.0, 3.0), "c": {"reachable": False, "error": "x"}}}
    assert [(r["at"], r["nodeId"]) for r in cluster_timeline(report)] == [(1.0, "a"), (2.0, "b"), (3.0, "b"), (4.0, "a")]
    assert [r["at"] for r in cluster_timeline(report, limit=2)] == [3.0, 4.0]
