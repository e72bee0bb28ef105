"""Every Prometheus metric a node exposes on `GET /metrics`, defined once, here.

Two kinds:
- `ServingMetrics`: counters and histograms fed as requests happen (HTTP requests by route
  template, generations by model and outcome, time to first token, inter-token latency,
  prompt and generated tokens).
- `node_families`: gauges and counters read at scrape time from what the node already
  keeps (its `/v1/diagnostics/node` report, its State and telemetry), so nothing is
  counted twice and nothing is updated on a hot path for a value only a scrape reads.

Labels are bounded by construction: route templates (never raw paths), model ids that
passed `bind_instance` (so they name a placed model's card), instance and runner ids of
live runners on this node, transport reject reasons, topic names. Never prompt text,
request ids or client addresses.

Each node owns one `CollectorRegistry` (never the process-global default), so several nodes
in one test process never collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State
from skulk.shared.types.telemetry import ServingCounters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format's content type."""

UNMATCHED_ROUTE = "unmatched"
"""The route label of a request no route matched (a 404 on an unknown path): one label for
every unknown path, so a scanner cannot grow the label set."""

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Request and first-token latency buckets: from a cached tiny model's few milliseconds to
a cold large model's minute-long prefill."""

TOKEN_GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
"""Inter-token latency buckets: 1 ms (tokens arriving in one batch) to seconds (a stall)."""

STREAM_OUTCOMES = ("completed", "failed", "cancelled", "client_closed")
"""The `outcome` label of `skulk_generations_total`."""


@dataclass
class _Totals:
    generated_tokens: int = 0
    generations: int = 0
    failed_generations: int = 0
    ttft_seconds_sum: float = 0.0
    ttft_count: int = 0


class ServingMetrics:
    """The request-time metrics of one node, registered on its own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._totals = _Totals()
        """Plain running totals beside the labelled series: what the node's telemetry carries
        (`NodeResources.serving`) without reading the registry back."""
        self.http_requests = Counter(
            "skulk_http_requests", "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"], registry=registry,
        )
        self.http_duration = Histogram(
            "skulk_http_request_duration_seconds", "Time from request to the end of the response body.",
            ["route"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.generations = Counter(
            "skulk_generations", "Command streams (generations, embeddings) ended, by model and outcome.",
            ["model", "outcome"], registry=registry,
        )
        self.time_to_first_token = Histogram(
            "skulk_time_to_first_token_seconds", "From the command's submission to its first output chunk.",
            ["model"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )
        self.inter_token_latency = Histogram(
            "skulk_inter_token_latency_seconds", "Gap between consecutive output chunks of one stream.",
            ["model"], buckets=TOKEN_GAP_BUCKETS_S, registry=registry,
        )
        self.prompt_tokens = Counter(
            "skulk_prompt_tokens", "Prompt tokens of ended generations (from the runner's usage).",
            ["model"], registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "skulk_prompt_cached_tokens",
            "Prompt tokens of ended generations whose KV the engine re-used from its prefix cache.",
            ["model"], registry=registry,
        )
        self.drafted_tokens = Counter(
            "skulk_speculative_drafted_tokens",
            "Tokens a speculative drafter proposed for ended generations (the target model checked each).",
            ["model"], registry=registry,
        )
        self.accepted_draft_tokens = Counter(
            "skulk_speculative_accepted_tokens",
            "Drafted tokens the target model accepted; over drafted: the acceptance rate.",
            ["model"], registry=registry,
        )
        self.generated_tokens = Counter(
            "skulk_generated_tokens", "Output chunks (tokens) delivered to clients.",
            ["model"], registry=registry,
        )

    # -- HTTP --

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_duration.labels(route).observe(seconds)

    # -- command streams (skulk.api.streams.StreamObserver) --

    def on_chunk(self, model_id: str, since_previous_s: float, first: bool, is_token: bool) -> None:
        """One output chunk reached this node's stream (`since_previous_s` is the time to
        first output when `first`); only text-generation chunks count as tokens."""
        if first:
            self.time_to_first_token.labels(model_id).observe(since_previous_s)
            self._totals.ttft_seconds_sum += max(0.0, since_previous_s)
            self._totals.ttft_count += 1
        else:
            self.inter_token_latency.labels(model_id).observe(since_previous_s)
        if is_token:
            self.generated_tokens.labels(model_id).inc()
            self._totals.generated_tokens += 1

    def on_end(self, model_id: str, outcome: str, prompt_tokens: int, cached_tokens: int = 0,
               drafted_tokens: int = 0, accepted_draft_tokens: int = 0) -> None:
        self.generations.labels(model_id, outcome).inc()
        self._totals.generations += 1
        self._totals.failed_generations += outcome == "failed"
        if prompt_tokens:
            self.prompt_tokens.labels(model_id).inc(prompt_tokens)
        if cached_tokens:
            self.cached_prompt_tokens.labels(model_id).inc(cached_tokens)
        if drafted_tokens:
            self.drafted_tokens.labels(model_id).inc(drafted_tokens)
            self.accepted_draft_tokens.labels(model_id).inc(accepted_draft_tokens)


    def totals(self) -> ServingCounters:
        """What this node's API streamed since it started (no runner load: the worker adds it)."""
        t = self._totals
        return ServingCounters(generated_tokens=t.generated_tokens, generations=t.generations,
                               failed_generations=t.failed_generations, ttft_seconds_sum=t.ttft_seconds_sum,
                               ttft_count=t.ttft_count)


def new_registry() -> CollectorRegistry:
    """A registry of this node's own (never the global default, see the module docstring)."""
    return CollectorRegistry(auto_describe=True)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(registry)


# -- scrape-time families -----------------------------------------------------------------


def _get(mapping: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(mapping, Mapping) or key not in mapping:
            return default
        mapping = mapping[key]
    return mapping


def _streams(diag: Mapping[str, Any]) -> Iterable[Metric]:
    streams = diag.get("streams") or {}
    open_ = GaugeMetricFamily("skulk_api_streams_open", "Command streams open on this API node (requests in flight).")
    open_.add_metric([], streams.get("openStreams", 0))
    capacity = GaugeMetricFamily("skulk_api_streams_capacity", "Most command streams this API node holds at once.")
    capacity.add_metric([], streams.get("capacity", 0))
    queued = GaugeMetricFamily("skulk_api_streams_queued_chunks", "Output chunks waiting for slow clients.")
    queued.add_metric([], streams.get("queuedFrames", 0))
    rejected = CounterMetricFamily("skulk_api_streams_rejected_overloaded",
                                   "Requests refused because every stream slot was taken (503).")
    rejected.add_metric([], streams.get("rejectedOverloaded", 0))
    return (open_, capacity, queued, rejected)


def _runners(diag: Mapping[str, Any]) -> Iterable[Metric]:
    runners: Mapping[str, Any] = _get(diag, "worker", "runners", default={}) or {}
    in_flight = GaugeMetricFamily("skulk_instance_in_flight", "Generations in flight on this node's runners.",
                                  labels=["instance"])
    depth = GaugeMetricFamily("skulk_instance_queue_depth", "Messages queued in this node's runner inboxes.",
                              labels=["instance"])
    by_state = GaugeMetricFamily("skulk_runners", "This node's runner processes by state.", labels=["state"])
    per_instance: dict[str, list[int]] = {}
    states: dict[str, int] = {}
    for stats in runners.values():
        totals = per_instance.setdefault(str(stats.get("instanceId")), [0, 0])
        totals[0] += int(stats.get("inFlight") or 0)
        totals[1] += int(stats.get("inboxDepth") or 0)
        state = str(stats.get("status") or "Unknown")
        states[state] = states.get(state, 0) + 1
    for instance, (flying, queued) in sorted(per_instance.items()):
        in_flight.add_metric([instance], flying)
        depth.add_metric([instance], queued)
    for state, count in sorted(states.items()):
        by_state.add_metric([state], count)
    failures = CounterMetricFamily("skulk_runner_failures", "Runner processes of this node that failed "
                                   "(each is restarted unless its instance is re-placed or keeps failing).")
    failures.add_metric([], _get(diag, "worker", "runnerFailures", default=0) or 0)
    return (in_flight, depth, by_state, failures)


def _events(diag: Mapping[str, Any], state: State) -> Iterable[Metric]:
    index = GaugeMetricFamily("skulk_event_log_applied_index", "Index of the last event this node applied.")
    index.add_metric([], state.last_event_applied_idx)
    pending = GaugeMetricFamily("skulk_event_apply_pending",
                                "Events received but not yet applied (waiting for a gap to fill): the apply lag.")
    pending.add_metric([], _get(diag, "replica", "bufferedEvents", default=0) or 0)
    applied = CounterMetricFamily("skulk_events_applied", "Events this node applied since it started.")
    applied.add_metric([], _get(diag, "replica", "applied", default=0) or 0)
    listener_errors = CounterMetricFamily(
        "skulk_replica_listener_errors", "Exceptions raised by State listeners after an event applied (logged, "
        "isolated: the node carries on). Non-zero means a bug.")
    listener_errors.add_metric([], _get(diag, "replica", "listenerErrors", default=0) or 0)
    families = [index, pending, applied, listener_errors]
    indexed = _get(diag, "master", "indexed")
    if indexed is not None:
        counter = CounterMetricFamily("skulk_master_events_indexed", "Events indexed while this node is master.")
        counter.add_metric([], indexed)
        families.append(counter)
    return families


def _transport(diag: Mapping[str, Any]) -> Iterable[Metric]:
    rejects = CounterMetricFamily("skulk_transport_rejects", "Inbound payloads dropped by the transport, by reason.",
                                  labels=["reason"])
    for reason, count in sorted((_get(diag, "transport", "rejected", default={}) or {}).items()):
        rejects.add_metric([str(reason)], count)
    dropped = CounterMetricFamily("skulk_transport_queue_dropped", "Messages dropped by full subscription queues.",
                                  labels=["topic"])
    for topic, stats in sorted((_get(diag, "transport", "topics", default={}) or {}).items()):
        dropped.add_metric([str(topic)], stats.get("dropped", 0))
    return (rejects, dropped)


def _downloads(telemetry: TelemetryView, node_id: str) -> Iterable[Metric]:
    done = GaugeMetricFamily("skulk_download_bytes", "Bytes fetched so far by this node's downloads in progress.",
                             labels=["model"])
    total = GaugeMetricFamily("skulk_download_total_bytes", "Bytes this node's downloads in progress will fetch.",
                              labels=["model"])
    node = telemetry.nodes.get(NodeId(node_id))
    for model_id, progress in sorted((node.downloads if node else {}).items()):
        done.add_metric([model_id], progress.downloaded_bytes)
        total.add_metric([model_id], progress.total_bytes)
    return (done, total)


def _recorder(diag: Mapping[str, Any]) -> Iterable[Metric]:
    recorded = CounterMetricFamily("skulk_flight_recorder_records", "Records written to this node's flight recorder.")
    recorded.add_metric([], _get(diag, "flightRecorder", "recorded", default=0) or 0)
    return (recorded,)


def node_families(diag: Mapping[str, Any], state: State, telemetry: TelemetryView, node_id: str) -> list[Metric]:
    """The scrape-time families of one node, from its diagnostics report, State and
    telemetry. Pure: a missing section yields zeros, never an error."""
    return [*_streams(diag), *_runners(diag), *_events(diag, state), *_transport(diag),
            *_downloads(telemetry, node_id), *_recorder(diag)]


class NodeCollector(Collector):
    """Adapts `node_families` to prometheus_client: read the node at every scrape."""

    def __init__(self, read: Callable[[], tuple[Mapping[str, Any], State, TelemetryView]], node_id: str) -> None:
        self._read = read
        self._node_id = node_id

    def collect(self) -> Iterable[Metric]:
        diag, state, telemetry = self._read()
        return node_families(diag, state, telemetry, self._node_id)

    def describe(self) -> Iterable[Metric]:
        return ()  # dynamic families: nothing to check for collisions at registration


__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS_S",
    "STREAM_OUTCOMES",
    "TOKEN_GAP_BUCKETS_S",
    "UNMATCHED_ROUTE",
    "NodeCollector",
    "ServingMetrics",
    "exposition",
    "new_registry",
    "node_families",
]
