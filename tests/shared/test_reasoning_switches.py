"""Turning reasoning on, off or to a level through the card's template switches: what is
refused, and what the template is given."""

from __future__ import annotations

import pytest

from skulk.shared.reasoning_switches import refusal, template_kwargs

QWEN3 = ("enable_thinking",)
GPT_OSS = ("reasoning_effort",)


@pytest.mark.parametrize(("reasons", "switches", "thinking", "effort", "refused", "kwargs"), [
    (True, QWEN3, False, None, None, {"enable_thinking": False}),
    (True, QWEN3, True, None, None, {"enable_thinking": True}),
    (True, ("thinking",), False, None, None, {"thinking": False}),
    (True, GPT_OSS, None, "high", None, {"reasoning_effort": "high"}),
    (True, GPT_OSS, True, None, None, {}),  # it always reasons: on is what it does
    (True, GPT_OSS, False, None, "always reasons", None),
    (True, QWEN3, None, "low", "takes no reasoning level", None),
    (False, (), True, None, "does not reason", None),
    (False, (), False, None, None, {}),  # off on a model that never reasons: nothing to do
    (True, (), None, None, None, {}),
])
def test_switches(reasons, switches, thinking, effort, refused, kwargs):
    why = refusal(reasons, switches, thinking, effort)
    assert (why is None) == (refused is None) and (refused is None or refused in why)
    if kwargs is not None:
        assert template_kwargs(switches, thinking, effort) == kwargs
