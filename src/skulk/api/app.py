"""The FastAPI application factory.

Routes read node data through `ApiContext` (plain callables wired by `node.py`) and never
reach into subsystems directly, so they stay testable with a hand-built context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from skulk import __version__
from skulk.api.routes import control, diagnostics
from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.commands import Command
from skulk.shared.types.state import State


async def _no_cluster(_command: Command) -> None:
    raise RuntimeError("this node is not connected to a cluster")


@dataclass(frozen=True)
class ApiContext:
    node_id: str
    node_name: str
    get_state: Callable[[], State]
    get_telemetry: Callable[[], TelemetryView] = field(default=TelemetryView)
    get_master: Callable[[], tuple[str | None, str | None]] = field(default=lambda: (None, None))
    get_diagnostics: Callable[[], dict[str, Any]] = field(default=lambda: {})
    submit_command: Callable[[Command], Awaitable[None]] = field(default=_no_cluster)


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(title="Skulk", version=__version__)
    app.state.skulk = context
    app.include_router(control.router)
    app.include_router(diagnostics.router)
    return app
