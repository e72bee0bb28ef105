"""The FastAPI application factory.

Routes read node data through `ApiContext` (plain callables wired by `node.py`) and never
reach into subsystems directly, so they stay testable with a hand-built context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from skulk import __version__
from skulk.api.access import AccessPolicy
from skulk.api.auth import AccessMiddleware
from skulk.api.body_guard import BodyGuard
from skulk.api.cors import install_cors
from skulk.api.errors import install_error_handlers
from skulk.api.json_body import OllamaJsonBodies
from skulk.api.limits import RequestLimits
from skulk.api.openapi_errors import drop_validation_422
from skulk.api.request_metrics import RequestMetricsMiddleware
from skulk.api.routes import anthropic as anthropic_routes
from skulk.api.routes import (
    control,
    dashboard,
    diagnostics,
    events,
    instances,
    model_cards,
    ollama_models,
    responses_socket,
    traces,
)
from skulk.api.routes import ollama as ollama_routes
from skulk.api.routes import openai as openai_routes
from skulk.api.routes import sessions as sessions_routes
from skulk.api.routes import store as store_routes
from skulk.api.state_feed import StateFeed
from skulk.api.streams import CommandStreams
from skulk.observe.metrics import NodeCollector, ServingMetrics, new_registry
from skulk.observe.traces import TraceStore
from skulk.shared.serving import serving
from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import Command
from skulk.shared.types.ids import ModelId, NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.state import State
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.telemetry import NodeResources

OLLAMA_OPENAI_PREFIX = "/ollama"
"""Ollama serves the OpenAI API under its own base URL (`/v1/...` there is `/ollama/v1/...` here)."""


async def _no_cluster(_command: Command) -> None:
    raise RuntimeError("this node is not connected to a cluster")


def _no_relay(_item: TaskInput | str) -> None:
    """A context with no cluster has nobody to hand a request's text to."""


@dataclass(frozen=True)
class ApiContext:
    node_id: str
    node_name: str
    get_state: Callable[[], State]
    get_telemetry: Callable[[], TelemetryView] = field(default=TelemetryView)
    get_master: Callable[[], tuple[str | None, str | None]] = field(default=lambda: (None, None))
    get_diagnostics: Callable[[], dict[str, Any]] = field(default=lambda: {})
    submit_command: Callable[[Command], Awaitable[None]] = field(default=_no_cluster)
    hold_input: Callable[[TaskInput], None] = field(default=_no_relay)
    """Keep a request's full params until the master binds its task, then send them to the
    node that runs it (`skulk.cluster.task_inputs.TaskInputRelay.hold`): the command the
    master sees carries redacted params only."""
    discard_input: Callable[[str], None] = field(default=_no_relay)
    """Forget the held input of a command that never reached the master."""
    streams: CommandStreams = field(default_factory=CommandStreams)
    """This node's open command streams: the node calls `streams.deliver(frame)` for every
    DATA frame addressed to it, and `streams.fail_all` when the master session changes."""
    find_instance: Callable[[str], Instance | None] | None = None
    """The placed instance a request for a model id binds to (None: 404). Defaults to a
    lookup in `get_state()`."""
    list_instances: Callable[[], list[Instance]] | None = None
    """Every placed instance. Defaults to those in `get_state()`."""
    get_cards: Callable[[], Mapping[ModelId, ModelCard]] = field(default=dict)
    """Model cards this node resolves (built-in, local custom, cluster custom)."""
    get_resources: Callable[[], Mapping[NodeId, NodeResources]] = field(default=dict)
    """Latest NodeResources of every member (the placement planner's memory input)."""
    api_key: str | None = None
    """When set, every route but the dashboard's static assets requires this key (Bearer,
    or `x-api-key` on /v1/messages); None or empty leaves the API open. The node passes
    `SKULK_API_KEY` (`skulk.api.auth.API_KEY_ENV`) or its configured key."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed beside this machine's own (`skulk.api.cors`)."""
    local_model_dirs: tuple[Path, ...] = ()
    """Directories `POST /models/add` may register local models from (the node passes its
    models dir and `models.local_dirs`); none: local paths are refused."""
    access: AccessPolicy | None = None
    """The node's full access policy (keys, roles, loopback, Host check: `skulk.api.access`).
    When None, `api_key` alone is required on every route but static assets, from every
    client (the shape of hand-built test apps)."""
    store: store_routes.StoreContext | None = None
    """The model store's roots and policy on this node (None: the /store routes answer 503)."""
    get_store: Callable[[], store_routes.StoreContext | None] | None = None
    """The store as it is now (it follows the elected master); defaults to `store`."""
    state_feed: StateFeed = field(default_factory=StateFeed)
    """Wakes `GET /v1/events` streams; the node calls `state_feed.record` per applied event."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """Request bounds (body size; see `skulk.api.limits`), enforced before any route parses."""
    traces: TraceStore | None = None
    """This node's parts of task-scoped traces (None: requests are never traced here)."""
    get_lost_members: Callable[[], Mapping[str, str]] = field(default=dict)
    """Members that left recently (node -> why), still listed unreachable by cluster
    diagnostics (`skulk.observe.lost_members`)."""
    sessions_dir: Path | None = None
    """Where `POST /v1/sessions/{id}/snapshot` writes (`<data>/sessions`); None: snapshots
    are returned but not stored."""
    get_peer_urls: Callable[[], Mapping[str, str | None]] = field(default=dict)
    """Every other member's API base URL (None: it has none), for cluster diagnostics and
    trace gathering (`skulk.observe.peer_http`)."""

    @property
    def peer_credential(self) -> str | None:
        """What this node presents to its peers' APIs: the cluster's peer token (see
        `skulk.api.access`), or the shared API key of a hand-built context."""
        return self.access.peer_token if self.access is not None else self.api_key

    def __post_init__(self) -> None:
        # Frozen dataclass: defaults that need `get_state` are filled in once, here.
        if self.find_instance is None:
            object.__setattr__(self, "find_instance", lambda model_id: find_placed_instance(self.get_state(), model_id))
        if self.list_instances is None:
            object.__setattr__(self, "list_instances", lambda: list(self.get_state().instances.values()))
        if self.get_store is None:
            object.__setattr__(self, "get_store", lambda: self.store)


def find_placed_instance(state: State, model_id: str) -> Instance | None:
    """An instance of `model_id` in `state`, preferring one whose runners all serve; the
    master makes the final choice when it creates the task."""
    candidates = sorted((i for i in state.instances.values() if i.model_id == model_id), key=lambda i: i.instance_id)
    serving_now = [i for i in candidates if serving(state, i)]
    return (serving_now or candidates or [None])[0]


def create_app(context: ApiContext) -> FastAPI:
    # /docs serves Swagger UI from fastapi-offline's packaged assets: no CDN, works offline.
    app = FastAPIOffline(title="Skulk", version=__version__)
    documented = app.openapi
    app.openapi = lambda: drop_validation_422(documented())  # type: ignore[method-assign]
    app.state.skulk = context
    install_error_handlers(app)
    # Middleware added later wraps what was added before: the access policy (outermost but
    # for CORS, added last so a preflight needs no key) runs first, so the bodies of refused
    # requests are never read.
    app.add_middleware(OllamaJsonBodies)
    app.add_middleware(BodyGuard, max_body_bytes=context.limits.max_body_bytes)
    policy = context.access or (AccessPolicy(api_key=context.api_key, require_key_on_loopback=True)
                                if context.api_key else None)
    if policy is not None:
        app.add_middleware(AccessMiddleware, policy=policy)
    app.state.metrics = _serving_metrics(context)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)  # outermost: counts 401s too
    app.include_router(control.router)
    app.include_router(diagnostics.router)
    app.include_router(instances.router)
    app.include_router(model_cards.router)
    app.include_router(openai_routes.router)
    app.include_router(responses_socket.router)
    # Ollama's OpenAI-compatible paths (clients pointed at an Ollama base URL + /v1): the
    # same routes, OpenAI's wire shape (skulk.api.errors), not in the schema twice.
    app.include_router(openai_routes.router, prefix=OLLAMA_OPENAI_PREFIX, include_in_schema=False)
    app.include_router(anthropic_routes.router)
    app.include_router(ollama_routes.router)
    app.include_router(store_routes.router)
    app.include_router(traces.router)
    app.include_router(sessions_routes.router)
    app.include_router(events.router)
    dashboard.mount(app)
    app.include_router(ollama_models.router)
    install_cors(app, context.cors_origins)  # last: the outermost middleware (see skulk.api.cors)
    return app


def _serving_metrics(context: ApiContext) -> ServingMetrics:
    """This app's metrics on a registry of its own (`GET /metrics`), fed by its requests,
    its command streams and, at scrape time, the node's diagnostics report."""
    registry = new_registry()
    metrics = ServingMetrics(registry)
    registry.register(NodeCollector(
        lambda: (context.get_diagnostics(), context.get_state(), context.get_telemetry()), context.node_id))
    context.streams.observer = metrics
    return metrics
