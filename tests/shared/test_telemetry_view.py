"""The TelemetryView: receipt-stamped latest readings, a bounded key map, attempt-aware
download progress, and the three-signal freshness every liveness decision reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from skulk.shared.telemetry_view import (
    MAX_TELEMETRY_KEYS,
    NodeFreshness,
    NodeTelemetry,
    TelemetryView,
    all_freshness,
    forget,
    freshness,
    live_download_progress,
    new_view,
    node_resources,
    record,
)
from skulk.shared.types.state import (
    DownloadStatusCompleted,
    DownloadStatusPending,
    NodeInfo,
    State,
)
from skulk.shared.types.telemetry import (
    DiskReading,
    DownloadProgress,
    MemoryReading,
    NodeHeartbeat,
    NodeResources,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _res(node: str, version: str = "1") -> NodeResources:
    return NodeResources(
        node_id=node, node_name=node, version=version,
        memory=MemoryReading(ram_total_bytes=8, ram_available_bytes=4),
        disk=DiskReading(models_dir="/m", total_bytes=100, free_bytes=50),
    )


def _prog(node: str, attempt: str, done: int, model: str = "m") -> DownloadProgress:
    return DownloadProgress(node_id=node, model_id=model, attempt_id=attempt, downloaded_bytes=done, total_bytes=100)


def _replay(readings: list[tuple], view: TelemetryView | None = None) -> TelemetryView:
    """readings: (sender, reading, received_at)"""
    view = view or new_view()
    for sender, reading, at in readings:
        view = record(view, sender, reading, at)
    return view


# (name, readings, expected NodeTelemetry of n1 (without retired attempts), ignored, stale)
CASES = [
    ("heartbeat-stamps-receipt-time",
     [("n1", NodeHeartbeat(node_id="n1"), 5.0)],
     NodeTelemetry(heartbeat_at=5.0), 0, 0),
    ("heartbeat-is-not-fallback-telemetry",
     [("n1", _res("n1"), 1.0), ("n1", NodeHeartbeat(node_id="n1"), 7.0)],
     NodeTelemetry(heartbeat_at=7.0, telemetry_at=1.0, resources=_res("n1")), 0, 0),
    ("resources-latest-wins",
     [("n1", _res("n1", "1"), 1.0), ("n1", _res("n1", "2"), 2.0)],
     NodeTelemetry(telemetry_at=2.0, resources=_res("n1", "2")), 0, 0),
    ("reading-about-another-node-ignored",
     [("n2", NodeHeartbeat(node_id="n1"), 3.0), ("n2", _res("n1"), 3.0)],
     None, 2, 0),
    ("progress-same-attempt-grows",
     [("n1", _prog("n1", "a", 10), 1.0), ("n1", _prog("n1", "a", 20), 2.0)],
     NodeTelemetry(telemetry_at=2.0, downloads={"m": _prog("n1", "a", 20)}), 0, 0),
    ("progress-same-attempt-going-backwards-is-delayed",
     [("n1", _prog("n1", "a", 20), 1.0), ("n1", _prog("n1", "a", 10), 2.0)],
     NodeTelemetry(telemetry_at=2.0, downloads={"m": _prog("n1", "a", 20)}), 0, 1),
    ("progress-new-attempt-replaces-even-with-fewer-bytes",
     [("n1", _prog("n1", "a", 80), 1.0), ("n1", _prog("n1", "b", 5), 2.0)],
     NodeTelemetry(telemetry_at=2.0, downloads={"m": _prog("n1", "b", 5)}), 0, 0),
    ("progress-of-replaced-attempt-dropped",
     [("n1", _prog("n1", "a", 10), 1.0), ("n1", _prog("n1", "b", 5), 2.0), ("n1", _prog("n1", "a", 90), 3.0)],
     NodeTelemetry(telemetry_at=3.0, downloads={"m": _prog("n1", "b", 5)}), 0, 1),
    ("progress-per-model",
     [("n1", _prog("n1", "a", 10, "x"), 1.0), ("n1", _prog("n1", "b", 5, "y"), 2.0)],
     NodeTelemetry(telemetry_at=2.0, downloads={"x": _prog("n1", "a", 10, "x"), "y": _prog("n1", "b", 5, "y")}), 0, 0),
]


@pytest.mark.parametrize(("name", "readings", "expected", "ignored", "stale"), CASES, ids=[c[0] for c in CASES])
def test_record(name: str, readings: list[tuple], expected: NodeTelemetry | None, ignored: int, stale: int) -> None:
    view = _replay(readings)
    got = view.nodes.get("n1")
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.heartbeat_at, got.telemetry_at, got.resources, dict(got.downloads)) == (
            expected.heartbeat_at, expected.telemetry_at, expected.resources, dict(expected.downloads))
    assert (view.ignored, view.stale) == (ignored, stale)


def test_record_never_mutates_its_input() -> None:
    view = _replay([("n1", _prog("n1", "a", 10), 1.0), ("n1", NodeHeartbeat(node_id="n1"), 1.0)])
    before = (dict(view.nodes), view.keys, dict(view.nodes["n1"].downloads))
    record(view, "n1", _prog("n1", "b", 1), 2.0)
    record(view, "n1", NodeHeartbeat(node_id="n1"), 3.0)
    assert (dict(view.nodes), view.keys, dict(view.nodes["n1"].downloads)) == before


def test_keys_are_bounded_and_the_least_recently_written_is_evicted() -> None:
    view = new_view()
    for i in range(MAX_TELEMETRY_KEYS):
        view = record(view, f"n{i}", NodeHeartbeat(node_id=f"n{i}"), float(i))
    view = record(view, "n0", NodeHeartbeat(node_id="n0"), 1000.0)  # refreshed: now the newest
    assert view.evicted == 0 and len(view.keys) == MAX_TELEMETRY_KEYS
    view = record(view, "new", _res("new"), 1001.0)
    assert view.evicted == 1 and len(view.keys) == MAX_TELEMETRY_KEYS
    assert "n1" not in view.nodes  # its only key was the oldest; nothing left of it
    assert view.nodes["n0"].heartbeat_at == 1000.0
    assert view.nodes["new"].resources == _res("new")


def test_evicting_one_kind_keeps_the_nodes_other_readings() -> None:
    view = record(new_view(), "a", _prog("a", "x", 1), 0.0)
    view = record(view, "a", NodeHeartbeat(node_id="a"), 1.0)
    for i in range(MAX_TELEMETRY_KEYS - 1):
        view = record(view, f"n{i}", NodeHeartbeat(node_id=f"n{i}"), 2.0 + i)
    assert view.evicted == 1
    assert dict(view.nodes["a"].downloads) == {} and view.nodes["a"].heartbeat_at == 1.0


def test_forget_drops_the_node_and_frees_its_keys() -> None:
    view = _replay([("n1", NodeHeartbeat(node_id="n1"), 1.0), ("n1", _prog("n1", "a", 1), 1.0),
                    ("n2", NodeHeartbeat(node_id="n2"), 1.0)])
    view = forget(view, "n1")
    assert set(view.nodes) == {"n2"} and [k[0] for k in view.keys] == ["n2"]
    assert forget(view, "ghost") is view


S = State(nodes={
    "n1": NodeInfo(node_id="n1", node_name="a", version="1", last_seen=T0),
    "n2": NodeInfo(node_id="n2", node_name="b", version="1"),
})


# (name, readings, node, now (monotonic), now_utc offset s, expected freshness)
FRESHNESS = [
    ("all-three", [("n1", NodeHeartbeat(node_id="n1"), 100.0), ("n1", _res("n1"), 90.0)], "n1", 103.0, 40.0,
     NodeFreshness(heartbeat_age_s=3.0, telemetry_age_s=13.0, last_event_age_s=40.0), 3.0),
    ("telemetry-fallback", [("n1", _res("n1"), 90.0)], "n1", 100.0, 40.0,
     NodeFreshness(telemetry_age_s=10.0, last_event_age_s=40.0), 10.0),
    ("last-event-only", [], "n1", 100.0, 12.5,
     NodeFreshness(last_event_age_s=12.5), 12.5),
    ("nothing-known", [], "n2", 100.0, 12.5, NodeFreshness(), None),
    ("not-a-member-still-has-telemetry", [("n3", NodeHeartbeat(node_id="n3"), 99.0)], "n3", 100.0, 0.0,
     NodeFreshness(heartbeat_age_s=1.0), 1.0),
    ("future-receipt-clamped", [("n1", NodeHeartbeat(node_id="n1"), 101.0)], "n1", 100.0, -5.0,
     NodeFreshness(heartbeat_age_s=0.0, last_event_age_s=0.0), 0.0),
]


@pytest.mark.parametrize(("name", "readings", "node", "now", "utc_s", "expected", "effective"), FRESHNESS,
                         ids=[c[0] for c in FRESHNESS])
def test_freshness(name: str, readings: list[tuple], node: str, now: float, utc_s: float,
                   expected: NodeFreshness, effective: float | None) -> None:
    got = freshness(_replay(readings), S, node, now, T0 + timedelta(seconds=utc_s))
    assert got == expected
    assert got.effective_age_s == effective


def test_all_freshness_covers_every_member() -> None:
    got = all_freshness(new_view(), S, 0.0, T0)
    assert list(got) == ["n1", "n2"]


def test_node_resources_only_for_members() -> None:
    view = _replay([("n1", _res("n1"), 1.0), ("n3", _res("n3"), 1.0), ("n2", NodeHeartbeat(node_id="n2"), 1.0)])
    assert node_resources(view, S) == {"n1": _res("n1")}


def test_live_progress_follows_the_ordered_attempt() -> None:
    state = S.model_copy(update={"downloads": {
        "n1": {"x": DownloadStatusPending(attempt_id="a2"), "y": DownloadStatusCompleted(attempt_id="b", total_bytes=1),
               "z": DownloadStatusPending(attempt_id="c")},
    }})
    view = _replay([
        ("n1", _prog("n1", "a1", 50, "x"), 1.0),   # an attempt State already replaced
        ("n1", _prog("n1", "b", 50, "y"), 1.0),    # late progress after completion
        ("n1", _prog("n1", "c", 7, "z"), 1.0),     # the live one
        ("n2", _prog("n2", "d", 7, "x"), 1.0),     # nothing pending on n2
    ])
    assert live_download_progress(view, state) == {"n1": {"z": _prog("n1", "c", 7, "z")}}
