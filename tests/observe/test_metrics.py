"""The scrape-time families (`node_families`) over hand-built diagnostics reports, and the
request-time metrics fed by command streams: table-driven, no node, no event loop."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from skulk.api.streams import CommandStreams
from skulk.observe.metrics import ServingMetrics, exposition, new_registry, node_families
from skulk.shared.telemetry_view import NodeTelemetry, TelemetryView
from skulk.shared.types.chunks import StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.shared.types.common import Usage
from skulk.shared.types.state import State
from skulk.shared.types.telemetry import DownloadProgress


def samples(diag, state: State | None = None, telemetry: TelemetryView | None = None) -> dict[tuple, float]:
    out = {}
    for family in node_families(diag, state or State(), telemetry or TelemetryView(), "n1"):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


RUNNERS = {"worker": {"runnerFailures": 2, "runners": {
    "r1": {"instanceId": "i1", "inFlight": 2, "inboxDepth": 1, "status": "Running"},
    "r2": {"instanceId": "i1", "inFlight": 1, "inboxDepth": 0, "status": "Running"},
    "r3": {"instanceId": "i2", "inFlight": 0, "inboxDepth": 0, "status": "Loading"},
}}}


@pytest.mark.parametrize(("diag", "sample", "labels", "expected"), [
    ({}, "skulk_api_streams_open", {}, 0),
    ({"streams": {"openStreams": 3, "capacity": 256}}, "skulk_api_streams_open", {}, 3),
    ({"streams": {"openStreams": 3, "capacity": 256}}, "skulk_api_streams_capacity", {}, 256),
    ({"streams": {"rejectedOverloaded": 4}}, "skulk_api_streams_rejected_overloaded_total", {}, 4),
    (RUNNERS, "skulk_instance_in_flight", {"instance": "i1"}, 3),
    (RUNNERS, "skulk_instance_queue_depth", {"instance": "i1"}, 1),
    (RUNNERS, "skulk_runners", {"state": "Running"}, 2),
    (RUNNERS, "skulk_runners", {"state": "Loading"}, 1),
    (RUNNERS, "skulk_runner_failures_total", {}, 2),
    ({"replica": {"bufferedEvents": 7, "applied": 40}}, "skulk_event_apply_pending", {}, 7),
    ({"replica": {"bufferedEvents": 7, "applied": 40}}, "skulk_events_applied_total", {}, 40),
    ({"replica": {"listenerErrors": 3}}, "skulk_replica_listener_errors_total", {}, 3),
    ({"master": {"indexed": 12}}, "skulk_master_events_indexed_total", {}, 12),
    ({"transport": {"rejected": {"bad_tag": 5, "replay": 1}}}, "skulk_transport_rejects_total", {"reason": "bad_tag"}, 5),
    ({"transport": {"topics": {"data": {"dropped": 9}}}}, "skulk_transport_queue_dropped_total", {"topic": "data"}, 9),
    ({"flightRecorder": {"recorded": 11}}, "skulk_flight_recorder_records_total", {}, 11),
])
def test_node_families_read_the_diagnostics_report(diag, sample, labels, expected):
    assert samples(diag)[(sample, tuple(sorted(labels.items())))] == expected


def test_a_follower_has_no_master_family_and_the_index_comes_from_state():
    got = samples({}, State(last_event_applied_idx=41))
    assert got[("skulk_event_log_applied_index", ())] == 41
    assert not any(name.startswith("skulk_master") for name, _ in got)


def test_downloads_of_this_node_only():
    progress = DownloadProgress(node_id="n1", model_id="m/a", attempt_id="a1", downloaded_bytes=10, total_bytes=40)
    other = DownloadProgress(node_id="n2", model_id="m/b", attempt_id="a2", downloaded_bytes=1, total_bytes=2)
    view = TelemetryView(nodes={"n1": NodeTelemetry(downloads={"m/a": progress}),
                                "n2": NodeTelemetry(downloads={"m/b": other})})
    got = samples({}, telemetry=view)
    assert got[("skulk_download_bytes", (("model", "m/a"),))] == 10
    assert got[("skulk_download_total_bytes", (("model", "m/a"),))] == 40
    assert not any(dict(labels).get("model") == "m/b" for _, labels in got)


def _run_stream(streams: CommandStreams, clock: list[float], command_id: str, tokens: int, *, fail: bool = False):
    streams.open(command_id, "m/x")
    clock[0] += 0.5
    streams.deliver(StreamStarted(command_id=command_id, runner_id="r"))
    for seq in range(1, tokens + 1):
        clock[0] += 0.25
        usage = Usage(prompt_tokens=7, completion_tokens=tokens, total_tokens=7 + tokens,
                      cached_tokens=5) if seq == tokens else None
        streams.deliver(StreamPayload(command_id=command_id, seq=seq,
                                      chunk=TokenChunk(command_id=command_id, text="t", usage=usage)))
    streams.deliver(StreamTerminal(command_id=command_id, seq=tokens + 1,
                                   outcome="failed" if fail else "completed", error_message="x" if fail else None,
                                   error_type="boom" if fail else None))


def test_streams_feed_ttft_gaps_tokens_and_outcomes():
    clock = [100.0]
    registry = new_registry()
    streams = CommandStreams(clock=lambda: clock[0])
    streams.observer = ServingMetrics(registry)
    _run_stream(streams, clock, "c1", 3)
    _run_stream(streams, clock, "c2", 2, fail=True)
    streams.open("c3", "m/x").close()

    got = {}
    for family in text_string_to_metric_families(exposition(registry).decode()):
        for s in family.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    m = (("model", "m/x"),)
    assert got[("skulk_generations_total", (("model", "m/x"), ("outcome", "completed")))] == 1
    assert got[("skulk_generations_total", (("model", "m/x"), ("outcome", "failed")))] == 1
    assert got[("skulk_generations_total", (("model", "m/x"), ("outcome", "client_closed")))] == 1
    assert got[("skulk_generated_tokens_total", m)] == 5
    assert got[("skulk_prompt_tokens_total", m)] == 14
    assert got[("skulk_prompt_cached_tokens_total", m)] == 10  # served from the engines' prefix caches
    assert got[("skulk_time_to_first_token_seconds_count", m)] == 2
    assert got[("skulk_time_to_first_token_seconds_sum", m)] == pytest.approx(0.75 * 2)
    assert got[("skulk_inter_token_latency_seconds_count", m)] == 3
    assert got[("skulk_inter_token_latency_seconds_sum", m)] == pytest.approx(0.75)
    # The same, as the plain totals the node's telemetry carries (`NodeResources.serving`).
    totals = streams.observer.totals()
    assert (totals.generated_tokens, totals.generations, totals.failed_generations, totals.ttft_count) == (5, 3, 1, 2)
    assert totals.ttft_seconds_sum == pytest.approx(1.5) and totals.instances == {}
    assert streams.stats()["completed"] == 1 and streams.stats()["closedByClient"] == 1
