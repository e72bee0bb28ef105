"""The FastAPI application factory.

The API reads node data through `ApiContext` (plain callables wired by `node.py`) and never
reaches into subsystems directly, so routes stay testable with a hand-built context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from skulk import __version__
from skulk.api.routes import control, diagnostics
from skulk.shared.types.state import State


@dataclass(frozen=True)
class ApiContext:
    node_id: str
    node_name: str
    get_state: Callable[[], State]
    get_diagnostics: Callable[[], dict[str, Any]] = field(default=lambda: {})


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(title="Skulk", version=__version__)
    app.state.skulk = context
    app.include_router(control.router)
    app.include_router(diagnostics.router)
    return app
