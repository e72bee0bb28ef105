"""Turning a model's reasoning on, off or to a level, through its own chat template.

Templates expose reasoning as variables: Qwen 3's `enable_thinking`, DeepSeek V3.1's and
Granite's `thinking`, gpt-oss's `reasoning_effort`. A card lists the ones its template reads
(`reasoning.switches`, found by the card builder). A request's `thinking` / `reasoning_effort`
is honoured through them, or refused when the model cannot do what was asked: never
silently dropped. Pure: the API asks `refusal` before anything runs; the engines render
with `template_kwargs`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

ON_OFF_SWITCHES = ("enable_thinking", "thinking")
EFFORT_SWITCH = "reasoning_effort"


def refusal(reasons: bool, switches: Collection[str], thinking: bool | None, effort: str | None) -> str | None:
    """Why the model (`reasons`: its card names a reasoning format) cannot honour the
    request's thinking / effort, or None when it can."""
    on_off = any(s in switches for s in ON_OFF_SWITCHES)
    if thinking is True and not reasons:
        return "does not reason (its card names no reasoning format)"
    if thinking is False and reasons and not on_off:
        return "always reasons: its chat template has no switch to turn reasoning off"
    if effort is not None and EFFORT_SWITCH not in switches:
        return "takes no reasoning level: its chat template has no reasoning_effort"
    return None


def template_kwargs(switches: Collection[str], thinking: bool | None, effort: str | None) -> dict[str, Any]:
    """The chat-template variables that carry the request's choice (empty: the template's
    own defaults). Assumes `refusal` found nothing to refuse."""
    kwargs: dict[str, Any] = {}
    if thinking is not None:
        kwargs.update({name: thinking for name in ON_OFF_SWITCHES if name in switches})
    if effort is not None and EFFORT_SWITCH in switches:
        kwargs[EFFORT_SWITCH] = effort
    return kwargs


__all__ = ["EFFORT_SWITCH", "ON_OFF_SWITCHES", "refusal", "template_kwargs"]
