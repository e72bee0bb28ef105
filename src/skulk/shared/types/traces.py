"""One span of a task-scoped trace, as nodes and runners record it and peers exchange it.

A span is a named interval (or an instant, `dur_us == 0` with `instant`) on one lane of one
node, in microseconds of wall-clock time since the epoch, so spans from several nodes can be
laid on one timeline (as well as the nodes' clocks agree). `args` holds small bounded facts
(token counts, outcomes, the model id): never prompt text or output.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from skulk.shared.types.base import WireModel

TraceLane = Literal["api", "master", "worker", "runner"]
"""Where on a node a span was recorded: one row per lane in a trace viewer."""


class TraceSpan(WireModel):
    name: str
    lane: TraceLane
    start_us: float
    dur_us: float = Field(default=0.0, ge=0)
    instant: bool = False
    args: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
