"""What the model-backed speech providers share: reaching the node's API context, the
admission rule "a ready model of this kind is placed here", and the default model.

A provider is built before the node's API exists (the registry is wired first), so it holds a
getter; a node that serves no API has nothing to submit commands with and refuses calls.
"""

from __future__ import annotations

from collections.abc import Callable

from skulk.api.context import ApiContext
from skulk.api.generation import placed_model
from skulk.api.speech_providers.advertising import SpeechKind, ready_models
from skulk.extensions.providers.errors import CapabilityError

ContextOf = Callable[[], ApiContext | None]

WHAT: dict[SpeechKind, str] = {"stt": "speech-to-text", "tts": "text-to-speech",
                               "stt_realtime": "realtime speech-to-text (audio.supports_realtime)"}


def api_of(context_of: ContextOf) -> ApiContext:
    context = context_of()
    if context is None:
        raise CapabilityError("admission_refused", "this node serves no API: speech providers need it")
    return context


def admission_refusal(context: ApiContext | None, kind: SpeechKind) -> str | None:
    """Why a call may not start now (the provider's `admit`), or None."""
    if context is None:
        return "this node serves no API: speech providers need it"
    if not ready_models(context.get_state(), context.get_cards(), kind):
        return f"no {WHAT[kind]} model is placed with ready runners; place one (POST /place) and retry"
    return None


def chosen_model(context: ApiContext, kind: SpeechKind, asked: str | None) -> str:
    """The placed model a call means: the one it names (an Ollama-style name resolves as on the
    routes), or the first ready one of `kind`. Raises `admission_refused` when none is ready."""
    if asked:
        return placed_model(context, asked)
    ready = ready_models(context.get_state(), context.get_cards(), kind)
    if not ready:
        raise CapabilityError("admission_refused", f"no {WHAT[kind]} model is placed with ready runners")
    return ready[0]


__all__ = ["ContextOf", "admission_refusal", "api_of", "chosen_model"]
