"""The FastAPI application factory.

Routes read node data through `ApiContext` (plain callables wired by `node.py`) and never
reach into subsystems directly, so they stay testable with a hand-built context.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from skulk import __version__
from skulk.api.access import AccessPolicy
from skulk.api.auth import AccessMiddleware
from skulk.api.body_guard import BodyGuard
from skulk.api.context import ApiContext
from skulk.api.cors import install_cors
from skulk.api.errors import install_error_handlers
from skulk.api.json_body import OllamaJsonBodies
from skulk.api.openapi_errors import drop_validation_422
from skulk.api.request_metrics import RequestMetricsMiddleware
from skulk.api.routes import anthropic as anthropic_routes
from skulk.api.routes import (
    capabilities,
    control,
    dashboard,
    diagnostics,
    events,
    instances,
    invites,
    model_cards,
    ollama_models,
    realtime,
    responses_socket,
    speech,
    speech_chain,
    telemetry,
    traces,
    workloads,
)
from skulk.api.routes import ollama as ollama_routes
from skulk.api.routes import openai as openai_routes
from skulk.api.routes import sessions as sessions_routes
from skulk.api.routes import store as store_routes
from skulk.api.routes import transcriptions as transcription_routes
from skulk.observe.metrics import NodeCollector, ServingMetrics, new_registry
from skulk.shared.body_limits import AUDIO_UPLOAD_PATHS, audio_body_bytes
from skulk.shared.types.workload_io import MAX_AUDIO_UPLOAD_BYTES

OLLAMA_OPENAI_PREFIX = "/ollama"
"""Ollama serves the OpenAI API under its own base URL (`/v1/...` there is `/ollama/v1/...` here)."""


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
    audio_limit = max(context.limits.max_body_bytes, audio_body_bytes(MAX_AUDIO_UPLOAD_BYTES))
    app.add_middleware(BodyGuard, max_body_bytes=context.limits.max_body_bytes,
                       path_limits=dict.fromkeys(AUDIO_UPLOAD_PATHS, audio_limit))
    policy = context.access or (AccessPolicy(api_key=context.api_key, require_key_on_loopback=True)
                                if context.api_key else None)
    if policy is not None:
        app.add_middleware(AccessMiddleware, policy=policy)
    app.state.metrics = _serving_metrics(context)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)  # outermost: counts 401s too
    app.include_router(capabilities.router)
    app.include_router(control.router)
    app.include_router(diagnostics.router)
    app.include_router(instances.router)
    app.include_router(invites.router)
    app.include_router(model_cards.router)
    app.include_router(openai_routes.router)
    app.include_router(responses_socket.router)
    app.include_router(realtime.router)
    app.include_router(speech.router)
    app.include_router(speech_chain.router)
    # Ollama's OpenAI-compatible paths (clients pointed at an Ollama base URL + /v1): the
    # same routes, OpenAI's wire shape (skulk.api.errors), not in the schema twice.
    app.include_router(openai_routes.router, prefix=OLLAMA_OPENAI_PREFIX, include_in_schema=False)
    app.include_router(anthropic_routes.router)
    app.include_router(ollama_routes.router)
    app.include_router(store_routes.router)
    app.include_router(telemetry.router)
    app.include_router(traces.router)
    app.include_router(workloads.router)
    app.include_router(transcription_routes.router)
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
