"""Task-scoped traces: each node keeps the spans it recorded for traced requests, answers
for them, and the node asked for a trace merges every node's part into one Chrome
trace-event document (what Perfetto and chrome://tracing open).

A trace's id is its request's command id. Tracing is decided once, by the API node that
receives the request, from the replicated `tracing_enabled` flag (`PUT /v1/tracing`); the
decision travels with the command (`GenerateText.traced`) and its task, so every node and
runner on the path records spans without asking again. When tracing is off, the only cost
on the serving path is checking that flag and a few `is None` tests.

Bounds: MAX_TRACES traces in memory per node (oldest forgotten first; each finished part is
also saved under the traces directory), MAX_SPANS_PER_TRACE spans per trace per node (later
spans counted as dropped). Saved files older than `tracing.retention_days` are deleted by
the janitor (`expired_trace_files` decides which).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skulk.shared.types.traces import TraceLane, TraceSpan

logger = logging.getLogger(__name__)

MAX_TRACES = 256
"""Traces kept in memory per node; older ones are read back from their saved files."""

MAX_SPANS_PER_TRACE = 4096
"""Spans kept per trace per node: a 4000-token generation in 16-token decode batches is 250
spans, so this only bites a runaway; the overflow is counted in the trace's args."""

LIST_LIMIT = 100
"""Traces listed by `GET /v1/traces` (newest first)."""

JANITOR_FIRST_SWEEP_S = 60.0
JANITOR_INTERVAL_S = 3600.0
"""The retention janitor sweeps a minute after start, then hourly."""

LANE_THREADS: dict[TraceLane, int] = {"api": 1, "master": 2, "worker": 3, "runner": 4}
"""Chrome trace thread id of each lane (one row per lane under each node's process)."""

_TRACE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def valid_trace_id(trace_id: str) -> bool:
    """Trace ids name files: only ids of the shape this cluster makes are accepted."""
    return bool(_TRACE_ID.match(trace_id))


def now_us() -> float:
    return time.time() * 1e6


@dataclass
class _Trace:
    spans: list[TraceSpan] = field(default_factory=list)
    dropped: int = 0
    started_us: float = 0.0


class TraceStore:
    """This node's parts of traces: spans added as they happen, saved when a part finishes."""

    def __init__(self, node_id: str, node_name: str, traces_dir: Path | None, *,
                 max_traces: int = MAX_TRACES, max_spans: int = MAX_SPANS_PER_TRACE) -> None:
        self.node_id = node_id
        self.node_name = node_name
        self.traces_dir = traces_dir
        self.max_traces = max_traces
        self.max_spans = max_spans
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self.save_failures = 0

    def add(self, trace_id: str, spans: Iterable[TraceSpan]) -> None:
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace(started_us=now_us())
            while len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)
        for span in spans:
            if len(trace.spans) >= self.max_spans:
                trace.dropped += 1
                continue
            trace.spans.append(span)
            trace.started_us = min(trace.started_us, span.start_us)

    def finish(self, trace_id: str) -> None:
        """This node's part of `trace_id` is complete: save it (best effort, logged)."""
        trace = self._traces.get(trace_id)
        if trace is None or self.traces_dir is None or not valid_trace_id(trace_id):
            return
        try:
            self.traces_dir.mkdir(parents=True, exist_ok=True)
            path = self.traces_dir / f"{trace_id}.json"
            tmp = path.with_suffix(".json.partial")
            tmp.write_text(json.dumps(self._part(trace_id, trace)))
            tmp.replace(path)
        except OSError as exc:
            self.save_failures += 1
            logger.warning("trace %s not saved: %s", trace_id, exc)

    def _part(self, trace_id: str, trace: _Trace) -> dict[str, Any]:
        return {"traceId": trace_id, "nodeId": self.node_id, "nodeName": self.node_name,
                "startedUs": trace.started_us, "dropped": trace.dropped,
                "spans": [s.to_wire() for s in trace.spans]}

    def part(self, trace_id: str) -> dict[str, Any] | None:
        """This node's part of `trace_id` (memory, else its saved file), or None."""
        trace = self._traces.get(trace_id)
        if trace is not None:
            return self._part(trace_id, trace)
        if self.traces_dir is None or not valid_trace_id(trace_id):
            return None
        try:
            return json.loads((self.traces_dir / f"{trace_id}.json").read_text())
        except (OSError, ValueError):
            return None

    def listing(self, limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
        """This node's traces, newest first: {traceId, startedUs, spans}."""
        entries: dict[str, dict[str, Any]] = {}
        if self.traces_dir is not None and self.traces_dir.is_dir():
            for path in self.traces_dir.glob("*.json"):
                try:
                    started = path.stat().st_mtime * 1e6
                except OSError:
                    continue
                entries[path.stem] = {"traceId": path.stem, "startedUs": started, "spans": None}
        for trace_id, trace in self._traces.items():
            entries[trace_id] = {"traceId": trace_id, "startedUs": trace.started_us, "spans": len(trace.spans)}
        return sorted(entries.values(), key=lambda e: -e["startedUs"])[:limit]

    def stats(self) -> dict[str, Any]:
        return {"inMemory": len(self._traces), "capacity": self.max_traces, "maxSpansPerTrace": self.max_spans,
                "saveFailures": self.save_failures}


# -- merging and the Chrome trace-event format ---------------------------------------------


def merge_listings(listings: Iterable[Sequence[Mapping[str, Any]]], limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """One list from several nodes' listings: per trace the earliest start and the nodes
    that hold a part, newest first. Pure."""
    merged: dict[str, dict[str, Any]] = {}
    for listing in listings:
        for entry in listing:
            trace_id = entry["traceId"]
            current = merged.setdefault(trace_id, {"traceId": trace_id, "startedUs": entry["startedUs"], "parts": 0})
            current["startedUs"] = min(current["startedUs"], entry["startedUs"])
            current["parts"] += 1
    return sorted(merged.values(), key=lambda e: -e["startedUs"])[:limit]


def chrome_trace(trace_id: str, parts: Sequence[Mapping[str, Any]], unreachable: Sequence[str] = ()) -> dict[str, Any]:
    """The Chrome trace-event document of one trace from its nodes' parts: one process per
    node (named after it), one thread per lane, complete ("X") events for intervals and
    instant ("i") events, sorted by start time. Pure."""
    events: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    for pid, part in enumerate(sorted(parts, key=lambda p: (p.get("startedUs", 0), p["nodeId"])), start=1):
        label = f"{part.get('nodeName') or ''} ({part['nodeId']})".strip()
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for lane, tid in LANE_THREADS.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}})
        for raw in part.get("spans", ()):
            span = TraceSpan.model_validate(raw)
            event: dict[str, Any] = {
                "name": span.name, "cat": span.lane, "pid": pid, "tid": LANE_THREADS[span.lane],
                "ts": span.start_us, "args": {"node": part["nodeId"], **span.args},
            }
            if span.instant:
                event.update(ph="i", s="t")
            else:
                event.update(ph="X", dur=span.dur_us)
            events.append(event)
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {"traceId": trace_id, "nodes": [p["nodeId"] for p in parts], "unreachable": list(unreachable)},
    }


# -- retention ---------------------------------------------------------------------------


def expired_trace_files(files: Iterable[tuple[Path, float]], now: float, retention_days: int) -> list[Path]:
    """Saved trace files (path, mtime in seconds) older than `retention_days`; none when the
    retention is 0 (keep forever). Pure."""
    if retention_days <= 0:
        return []
    cutoff = now - retention_days * 86400.0
    return sorted(path for path, mtime in files if mtime < cutoff)


def prune_trace_files(traces_dir: Path, retention_days: int, now: float | None = None) -> list[Path]:
    """Delete the saved traces `expired_trace_files` names; returns them. Never raises."""
    if not traces_dir.is_dir():
        return []
    files = []
    for path in traces_dir.glob("*.json*"):
        try:
            files.append((path, path.stat().st_mtime))
        except OSError:
            continue
    removed = []
    for path in expired_trace_files(files, time.time() if now is None else now, retention_days):
        try:
            path.unlink()
            removed.append(path)
        except OSError as exc:
            logger.warning("trace janitor: cannot remove %s: %s", path, exc)
    return removed


async def run_trace_janitor(traces_dir: Path, retention_days: int) -> None:
    """Delete saved traces past `retention_days` (0 keeps them): JANITOR_FIRST_SWEEP_S after
    start, then every JANITOR_INTERVAL_S. A failed sweep is logged and tried again at the
    next one; the janitor never ends its node."""
    await asyncio.sleep(JANITOR_FIRST_SWEEP_S)
    while True:
        try:
            removed = await asyncio.to_thread(prune_trace_files, traces_dir, retention_days)
            if removed:
                logger.info("trace janitor removed %d saved traces older than %d days", len(removed), retention_days)
        except Exception:
            logger.exception("trace janitor sweep failed")
        await asyncio.sleep(JANITOR_INTERVAL_S)


class RequestTrace:
    """The API node's spans of one traced request, built as it goes (one per request, on
    the event loop). `mark` closes the current phase and opens the next, so the request's
    timeline has no gaps: receive, then placement lookup -> submit to the master -> waiting
    for a runner to start it -> waiting for the first token -> streaming, then the end."""

    def __init__(self, store: TraceStore, trace_id: str, model_id: str) -> None:
        self.store = store
        self.trace_id = trace_id
        self.model_id = model_id
        self.started_us = now_us()
        self._phase = "api.placement_lookup"
        self._phase_start_us = self.started_us
        self._chunks = 0
        store.add(trace_id, [TraceSpan(name="api.receive", lane="api", start_us=self.started_us, instant=True,
                                       args={"model": model_id})])

    def mark(self, next_phase: str, **args: Any) -> None:
        now = now_us()
        self.store.add(self.trace_id, [TraceSpan(name=self._phase, lane="api", start_us=self._phase_start_us,
                                                 dur_us=max(now - self._phase_start_us, 0.0), args=args)])
        self._phase, self._phase_start_us = next_phase, now

    def chunk(self) -> None:
        self._chunks += 1
        if self._chunks == 1:
            self.mark("api.stream")

    def end(self, outcome: str) -> None:
        self.mark("done", chunks=self._chunks)
        now = self._phase_start_us
        self.store.add(self.trace_id, [
            TraceSpan(name="api.request", lane="api", start_us=self.started_us, dur_us=max(now - self.started_us, 0),
                      args={"model": self.model_id, "outcome": outcome, "chunks": self._chunks}),
            TraceSpan(name="api.stream_end", lane="api", start_us=now, instant=True, args={"outcome": outcome}),
        ])
        self.store.finish(self.trace_id)


@dataclass
class _Forwarding:
    command_id: str
    first_frame_us: float | None = None
    frames: int = 0


class WorkerTraces:
    """The worker's side of traced tasks on its node: the dispatch to a runner, the runner's
    own spans (`TraceSpans`), and the data-plane hop of the task's output frames (local
    delivery or the DATA topic to the owning API node). Holds only traced tasks in flight,
    each until its TaskDone."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store
        self._by_task: dict[str, _Forwarding] = {}
        self._by_command: dict[str, _Forwarding] = {}

    @property
    def active(self) -> bool:
        return bool(self._by_command)

    def dispatched(self, task: Any, runner_id: str) -> None:
        if not getattr(task, "traced", False):
            return
        forwarding = _Forwarding(task.command_id)
        self._by_task[task.task_id] = self._by_command[task.command_id] = forwarding
        self.store.add(task.command_id, [TraceSpan(
            name="worker.dispatch", lane="worker", start_us=now_us(), instant=True,
            args={"runner": runner_id, "instance": task.instance_id},
        )])

    def frame(self, command_id: str, owner: str, local: bool, terminal: bool) -> None:
        forwarding = self._by_command.get(command_id)
        if forwarding is None:
            return
        now = now_us()
        if forwarding.first_frame_us is None:
            forwarding.first_frame_us = now
        forwarding.frames += 1
        if terminal:
            self.store.add(command_id, [TraceSpan(
                name="worker.forward", lane="worker", start_us=forwarding.first_frame_us,
                dur_us=now - forwarding.first_frame_us,
                args={"frames": forwarding.frames, "to": owner, "path": "local" if local else "data-topic"},
            )])

    def runner_spans(self, command_id: str, spans: Sequence[TraceSpan]) -> None:
        if command_id in self._by_command:
            self.store.add(command_id, spans)

    def done(self, task_id: str) -> None:
        forwarding = self._by_task.pop(task_id, None)
        if forwarding is not None:
            self._by_command.pop(forwarding.command_id, None)
            self.store.finish(forwarding.command_id)


def master_decision_span(indexed: Any, i_am_master: bool, at_us: float) -> tuple[str, TraceSpan] | None:
    """The master's decision for a traced request, recorded by the master as it applies it:
    which instance the task was bound to (or that it was born failed). None on other nodes
    and for anything else. Pure."""
    event = indexed.event
    task: Any = getattr(event, "task", None)
    if not i_am_master or event.type != "TaskCreated" or not getattr(task, "traced", False):
        return None
    return task.command_id, TraceSpan(
        name="master.bind_task", lane="master", start_us=at_us, instant=True,
        args={"idx": indexed.idx, "task": task.task_id, "instance": task.instance_id, "status": task.status},
    )
