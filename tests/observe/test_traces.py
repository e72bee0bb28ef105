"""Trace storage, merging, the Chrome format, retention and the span builders: pure or
in-process, no node."""

from __future__ import annotations

import itertools
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from skulk.observe.traces import (
    RequestTrace,
    TraceStore,
    WorkerTraces,
    chrome_trace,
    expired_trace_files,
    master_decision_span,
    merge_listings,
    prune_trace_files,
    valid_trace_id,
)
from skulk.shared.types.events import IndexedEvent, TaskAcknowledged, TaskCreated
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams
from skulk.shared.types.traces import TraceSpan
from skulk.worker.runner.spans import DECODE_BATCH_TOKENS, RunnerSpans

DAY = 86400.0


def span(name: str, start: float, dur: float = 0.0, lane: str = "api", **args) -> TraceSpan:
    return TraceSpan(name=name, lane=lane, start_us=start, dur_us=dur, instant=dur == 0.0, args=args)


@pytest.mark.parametrize(("retention_days", "ages_days", "expected"), [
    (3, [1, 2.9, 3.1, 10], [2, 3]),
    (1, [0.5], []),
    (0, [1, 100], []),  # 0 keeps traces forever
])
def test_expired_trace_files(retention_days, ages_days, expected):
    now = 1_000 * DAY
    files = [(Path(f"t{i}.json"), now - age * DAY) for i, age in enumerate(ages_days)]
    assert expired_trace_files(files, now, retention_days) == [Path(f"t{i}.json") for i in expected]


@pytest.mark.parametrize(("trace_id", "ok"), [
    ("0f1e2d3c4b5a", True), ("a-b_c", True), ("../etc/passwd", False), ("", False), ("a" * 129, False), ("a.b", False),
])
def test_trace_ids_that_could_name_other_files_are_refused(trace_id, ok):
    assert valid_trace_id(trace_id) is ok


def test_the_store_bounds_traces_and_spans_and_saves_finished_parts(tmp_path):
    store = TraceStore("n1", "one", tmp_path, max_traces=2, max_spans=2)
    store.add("t1", [span("a", 10), span("b", 5), span("c", 20)])
    assert store.part("t1")["dropped"] == 1 and store.part("t1")["startedUs"] <= 5
    store.finish("t1")
    store.add("t2", [span("a", 30)])
    store.add("t3", [span("a", 40)])  # t1 falls out of memory; its saved file answers
    assert store.stats()["inMemory"] == 2
    part = store.part("t1")
    assert [s["name"] for s in part["spans"]] == ["a", "b"] and part["nodeId"] == "n1"
    assert store.part("t9") is None and store.part("../x") is None
    assert {e["traceId"] for e in store.listing()} == {"t1", "t2", "t3"}


def test_prune_deletes_only_expired_saved_parts(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    for path in (old, new):
        path.write_text("{}")
    os.utime(old, (1000.0, 1000.0))
    assert prune_trace_files(tmp_path, 3, now=1000.0 + 4 * DAY) == [old]
    assert not old.exists() and new.exists()
    assert prune_trace_files(tmp_path / "missing", 3) == []


def test_merge_listings_counts_parts_and_keeps_the_earliest_start():
    merged = merge_listings([[{"traceId": "a", "startedUs": 5.0}, {"traceId": "b", "startedUs": 9.0}],
                             [{"traceId": "a", "startedUs": 3.0}]])
    assert merged == [{"traceId": "b", "startedUs": 9.0, "parts": 1}, {"traceId": "a", "startedUs": 3.0, "parts": 2}]


def test_chrome_trace_names_a_process_per_node_and_a_thread_per_lane():
    parts = [
        {"nodeId": "nB", "nodeName": "b", "startedUs": 20.0, "spans": [span("runner.prefill", 20, 5, lane="runner").to_wire()]},
        {"nodeId": "nA", "nodeName": "a", "startedUs": 10.0, "spans": [span("api.request", 10, 40).to_wire(),
                                                                       span("api.stream_end", 50).to_wire()]},
    ]
    doc = chrome_trace("t1", parts, unreachable=["nC"])
    json.dumps(doc)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    events = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {1: "a (nA)", 2: "b (nB)"}  # ordered by when each node's part began
    assert [(e["name"], e["ph"], e["pid"], e["ts"]) for e in events] == [
        ("api.request", "X", 1, 10), ("runner.prefill", "X", 2, 20), ("api.stream_end", "i", 1, 50)]
    assert events[1]["tid"] != events[0]["tid"] and events[1]["dur"] == 5
    assert doc["otherData"] == {"traceId": "t1", "nodes": ["nB", "nA"], "unreachable": ["nC"]}


def test_request_trace_phases_leave_no_gap_and_end_with_the_outcome(tmp_path):
    store = TraceStore("n1", "one", tmp_path)
    trace = RequestTrace(store, "c1", "m/x")
    for phase in ("api.submit", "api.wait_runner", "api.wait_first_token"):
        trace.mark(phase)
    for _ in range(3):
        trace.chunk()
    trace.end("completed")
    spans = store.part("c1")["spans"]
    intervals = [s for s in spans if not s["instant"] and s["name"] != "api.request"]
    assert [s["name"] for s in intervals] == ["api.placement_lookup", "api.submit", "api.wait_runner",
                                              "api.wait_first_token", "api.stream"]
    for before, after in itertools.pairwise(intervals):
        assert before["startUs"] + before["durUs"] == pytest.approx(after["startUs"])
    request = next(s for s in spans if s["name"] == "api.request")
    assert request["args"] == {"model": "m/x", "outcome": "completed", "chunks": 3}
    assert (tmp_path / "c1.json").exists()  # the API's part is saved when the request ends


def test_runner_spans_batch_decode_steps():
    spans = RunnerSpans(admitted_us=1.0)
    spans.started()
    for _ in range(1 + DECODE_BATCH_TOKENS + 3):
        spans.token()
    names = [(s.name, s.args.get("tokens")) for s in spans.finish("completed")]
    assert names == [("runner.queue_wait", None), ("runner.prefill", None), ("runner.decode", DECODE_BATCH_TOKENS),
                     ("runner.decode", 3), ("runner.finish", DECODE_BATCH_TOKENS + 4)]


def test_worker_traces_follow_only_traced_tasks_until_done(tmp_path):
    store = TraceStore("n1", "one", tmp_path)
    worker = WorkerTraces(store)
    params = TextGenerationParams(model_id="m/x", prompt="p")
    plain = TextGeneration(task_id="t0", instance_id="i", command_id="c0", owner_node_id="api", params=params)
    traced = plain.model_copy(update={"task_id": "t1", "command_id": "c1", "traced": True})
    worker.dispatched(plain, "r1")
    assert not worker.active
    worker.dispatched(traced, "r1")
    worker.frame("c0", "api", False, False)  # untraced: ignored
    for terminal in (False, False, True):
        worker.frame("c1", "api", False, terminal)
    worker.runner_spans("c1", [span("runner.finish", 99, lane="runner")])
    worker.done("t1")
    assert not worker.active
    spans = {s["name"]: s for s in store.part("c1")["spans"]}
    assert set(spans) == {"worker.dispatch", "worker.forward", "runner.finish"}
    assert spans["worker.forward"]["args"] == {"frames": 3, "to": "api", "path": "data-topic"}
    assert store.part("c0") is None and (tmp_path / "c1.json").exists()


@pytest.mark.parametrize(("traced", "i_am_master", "event_type", "recorded"), [
    (True, True, "TaskCreated", True),
    (True, False, "TaskCreated", False),   # only the master records its decision
    (False, True, "TaskCreated", False),
    (True, True, "TaskAcknowledged", False),
])
def test_the_master_records_its_binding_of_traced_tasks(traced, i_am_master, event_type, recorded):
    params = TextGenerationParams(model_id="m/x", prompt="p")
    task = TextGeneration(task_id="t1", instance_id="i1", command_id="c1", owner_node_id="api", params=params,
                          traced=traced)
    event = TaskCreated(event_id="e", task=task) if event_type == "TaskCreated" else TaskAcknowledged(
        event_id="e", task_id="t1")
    indexed = IndexedEvent(idx=7, origin="m", indexed_at=datetime(2026, 1, 1, tzinfo=UTC), event=event)
    decided = master_decision_span(indexed, i_am_master, 5.0)
    if not recorded:
        assert decided is None
        return
    trace_id, span = decided
    assert trace_id == "c1" and span.lane == "master" and span.start_us == 5.0
    assert span.args == {"idx": 7, "task": "t1", "instance": "i1", "status": "Pending"}
