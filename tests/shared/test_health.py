"""Derived node health for GET /state: each reason, the level it gives, and the wire shape."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from skulk.shared.health import (
    DISK_FULL_ERROR_BYTES,
    DISK_LOW_WARN_BYTES,
    PRUNE_RISK_S,
    HealthReason,
    NodeHealth,
    derive_node_health,
    health_to_wire,
)
from skulk.shared.telemetry_view import HEARTBEAT_WARN_S, TelemetryView, new_view, record
from skulk.shared.types.state import (
    DownloadStatusCompleted,
    DownloadStatusFailed,
    DownloadStatusPending,
    NodeInfo,
    State,
)
from skulk.shared.types.telemetry import (
    CapabilityConflict,
    DiskReading,
    MemoryReading,
    NodeHeartbeat,
    NodeResources,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NOW = 1000.0
GIB = 1024**3


def _res(node: str, version: str = "1.0", free: int = 100 * GIB, conflicts: list | None = None,
         peers: int | None = None, reserve: int | None = None) -> NodeResources:
    extra = {} if peers is None else {"zenoh_connected_peers": peers}
    return NodeResources(
        node_id=node, node_name=node, version=version,
        memory=MemoryReading(ram_total_bytes=8 * GIB, ram_available_bytes=4 * GIB),
        disk=DiskReading(models_dir="/models", total_bytes=500 * GIB, free_bytes=free, reserve_bytes=reserve),
        capability_conflicts=conflicts or [], **extra,
    )


def _state(*nodes: str, last_seen_age_s: float = 1.0, downloads: dict | None = None) -> State:
    return State(
        nodes={n: NodeInfo(node_id=n, node_name=n, version="1", last_seen=T0 - timedelta(seconds=last_seen_age_s))
               for n in nodes},
        downloads=downloads or {},
    )


def _view(*readings: tuple) -> TelemetryView:
    """readings: (reading, age_s) — each recorded from its own node, age_s before NOW."""
    view = new_view()
    for reading, age in readings:
        view = record(view, reading.node_id, reading, NOW - age)
    return view


def _hb(node: str, age: float) -> tuple:
    return (NodeHeartbeat(node_id=node), age)


CONFLICT = CapabilityConflict(code="gpu_build_without_gpu", level="error", message="CUDA build, no GPU",
                              remediation="install the CPU build")
NOTE = CapabilityConflict(code="slow_disk", level="info", message="models on a network disk")

# (name, state, view readings, node -> (level, [(code, level)]))
CASES = [
    ("healthy", _state("a"), [_hb("a", 1.0), (_res("a"), 1.0)],
     {"a": ("ok", [])}),
    ("no-telemetry-yet-is-ok", _state("a"), [],
     {"a": ("ok", [])}),
    ("heartbeat-late-warns", _state("a"), [_hb("a", HEARTBEAT_WARN_S), (_res("a"), 5.0)],
     {"a": ("warn", [("heartbeat_late", "warn")])}),
    ("fallback-fresh-heartbeat-late-still-warns", _state("a"), [_hb("a", 15.0), (_res("a"), 1.0)],
     {"a": ("warn", [("heartbeat_late", "warn")])}),
    ("at-risk-of-pruning", _state("a", last_seen_age_s=60.0), [_hb("a", PRUNE_RISK_S), (_res("a"), 25.0)],
     {"a": ("error", [("heartbeat_late", "error")])}),
    ("at-risk-by-last-event-alone", _state("a", last_seen_age_s=PRUNE_RISK_S + 1), [],
     {"a": ("error", [("heartbeat_late", "error")])}),
    ("recent-event-saves-silent-telemetry", _state("a", last_seen_age_s=2.0), [_hb("a", 25.0)],
     {"a": ("warn", [("heartbeat_late", "warn")])}),
    ("download-failed-one-per-model",
     _state("a", downloads={"a": {"m2": DownloadStatusFailed(attempt_id="x", error_message="404"),
                                  "m1": DownloadStatusFailed(attempt_id="y", error_message="disk full"),
                                  "m3": DownloadStatusCompleted(attempt_id="z", total_bytes=1),
                                  "m4": DownloadStatusPending(attempt_id="w")}}),
     [_hb("a", 1.0)],
     {"a": ("error", [("download_failed", "error"), ("download_failed", "error")])}),
    ("disk-low", _state("a"), [_hb("a", 1.0), (_res("a", free=DISK_LOW_WARN_BYTES - 1), 1.0)],
     {"a": ("warn", [("disk_low", "warn")])}),
    ("disk-at-warn-threshold-ok", _state("a"), [(_res("a", free=DISK_LOW_WARN_BYTES), 1.0)],
     {"a": ("ok", [])}),
    # the node's advertised reserve moves the lines: under it, downloads are refused
    ("disk-under-own-reserve", _state("a"), [(_res("a", free=30 * GIB, reserve=40 * GIB), 1.0)],
     {"a": ("warn", [("disk_low", "warn")])}),
    ("disk-near-own-reserve", _state("a"), [(_res("a", free=45 * GIB, reserve=40 * GIB), 1.0)],
     {"a": ("warn", [("disk_low", "warn")])}),
    ("disk-zero-reserve-ok-at-15", _state("a"), [(_res("a", free=15 * GIB, reserve=0), 1.0)],
     {"a": ("ok", [])}),
    ("disk-full", _state("a"), [_hb("a", 1.0), (_res("a", free=DISK_FULL_ERROR_BYTES - 1), 1.0)],
     {"a": ("error", [("disk_full", "error")])}),
    ("capability-conflicts-mapped-through", _state("a"), [(_res("a", conflicts=[CONFLICT, NOTE]), 1.0)],
     {"a": ("error", [("gpu_build_without_gpu", "error"), ("slow_disk", "info")])}),
    ("info-conflict-alone-is-ok", _state("a"), [(_res("a", conflicts=[NOTE]), 1.0)],
     {"a": ("ok", [("slow_disk", "info")])}),
    ("version-mismatch-on-every-member", _state("a", "b", "c"),
     [(_res("a", "1.0"), 1.0), (_res("b", "1.1"), 1.0)],
     {"a": ("warn", [("version_mismatch", "warn")]), "b": ("warn", [("version_mismatch", "warn")]),
      "c": ("warn", [("version_mismatch", "warn")])}),
    ("same-version-no-mismatch", _state("a", "b"), [(_res("a"), 1.0), (_res("b"), 1.0)],
     {"a": ("ok", []), "b": ("ok", [])}),
    ("non-member-telemetry-ignored", _state("a"), [(_res("a", "1.0"), 1.0), (_res("ghost", "9"), 1.0)],
     {"a": ("ok", [])}),
    ("zenoh-isolated", _state("a", "b"), [(_res("a", peers=0), 1.0), (_res("b", peers=0), 1.0), (_res("c", peers=3), 1.0)],
     {"a": ("error", [("zenoh_isolated", "error")]), "b": ("error", [("zenoh_isolated", "error")])}),
    ("zenoh-connected", _state("a", "b"), [(_res("a", peers=1), 1.0), (_res("b", peers=1), 1.0)],
     {"a": ("ok", []), "b": ("ok", [])}),
    ("zenoh-unknown-during-grace", _state("a", "b"), [(_res("a"), 1.0), (_res("b", peers=1), 1.0)],
     {"a": ("ok", []), "b": ("ok", [])}),
    ("zenoh-alone-is-not-isolated", _state("a", "b"), [(_res("a", peers=0), 1.0), (_res("b"), 1.0)],
     {"a": ("ok", []), "b": ("ok", [])}),
    ("worst-reason-wins", _state("a"), [_hb("a", 12.0), (_res("a", free=DISK_FULL_ERROR_BYTES - 1), 1.0)],
     {"a": ("error", [("heartbeat_late", "warn"), ("disk_full", "error")])}),
]


@pytest.mark.parametrize(("name", "state", "readings", "expected"), CASES, ids=[c[0] for c in CASES])
def test_derive_node_health(name: str, state: State, readings: list, expected: dict) -> None:
    health = derive_node_health(state, _view(*readings), NOW, T0)
    got = {n: (h.level, [(r.code, r.level) for r in h.reasons]) for n, h in health.items()}
    assert got == expected


def test_every_reason_explains_itself() -> None:
    state = _state("a", "b", last_seen_age_s=30.0,
                   downloads={"a": {"org/model": DownloadStatusFailed(attempt_id="x", error_message="HTTP 404")}})
    view = _view(_hb("a", 25.0), (_res("a", "1.0", free=GIB), 22.0), (_res("b", "2.0"), 1.0))
    reasons = {r.code: r for r in derive_node_health(state, view, NOW, T0)["a"].reasons}
    assert set(reasons) == {"heartbeat_late", "download_failed", "disk_full", "version_mismatch"}
    assert "at risk of pruning" in reasons["heartbeat_late"].message
    assert "org/model" in reasons["download_failed"].message and "HTTP 404" in reasons["download_failed"].message
    assert "/models" in reasons["disk_full"].message
    assert "1.0 on a" in reasons["version_mismatch"].message and "2.0 on b" in reasons["version_mismatch"].message
    assert all(r.remediation for r in reasons.values())


def test_every_member_gets_an_entry_sorted() -> None:
    health = derive_node_health(_state("c", "a", "b"), new_view(), NOW, T0)
    assert list(health) == ["a", "b", "c"]


def test_wire_form_is_camel_case_json() -> None:
    health = {"a": NodeHealth(level="warn", reasons=[
        HealthReason(code="disk_low", level="warn", message="low", remediation="free space")])}
    wire = health_to_wire(health)
    assert wire == {"a": {"level": "warn", "reasons": [
        {"code": "disk_low", "level": "warn", "message": "low", "remediation": "free space"}]}}
    json.dumps(wire)


def test_derivation_does_not_touch_its_inputs() -> None:
    state = _state("a")
    view = _view(_hb("a", 12.0))
    before = (state.model_copy(deep=True), dict(view.nodes), view.keys)
    derive_node_health(state, view, NOW, T0)
    assert (state, dict(view.nodes), view.keys) == before


def test_disk_under_the_reserve_says_downloads_are_refused_and_how_to_fix_it() -> None:
    from skulk.shared.health import disk_reasons

    [reason] = disk_reasons(_res("a", free=8 * GIB, reserve=10 * GIB))
    assert "8.0 GiB free, under its 10 GiB download reserve" in reason.message
    assert "refused" in reason.message and "disk_reserve_gb" in (reason.remediation or "")


@pytest.mark.parametrize(("builds", "message", "remediation"), [
    # (node -> (version, commit)); the same version on other commits is a mismatch too
    ({"a": ("0.1.0", "aaa"), "b": ("0.1.0", "aaa"), "c": ("0.1.0", "bbb")},
     "0.1.0 (aaa) on a, b; 0.1.0 (bbb) on c", "upgrade c to 0.1.0 (aaa)"),
    ({"a": ("0.1.0", None), "b": ("0.2.0", None)}, "0.1.0 on a; 0.2.0 on b", "upgrade b to 0.1.0"),
    ({"a": ("0.1.0", "aaa"), "b": ("0.1.0", "aaa")}, None, None),
])
def test_a_mismatch_names_the_builds_and_the_nodes_to_upgrade(builds, message, remediation) -> None:
    from skulk.shared.health import version_mismatch_reason

    resources = {node: _res(node, version).model_copy(update={"commit": commit})
                 for node, (version, commit) in builds.items()}
    reason = version_mismatch_reason(resources)
    if message is None:
        assert reason is None
        return
    assert reason is not None and message in reason.message and reason.remediation.startswith(remediation)
