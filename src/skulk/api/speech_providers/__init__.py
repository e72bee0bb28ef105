"""The first-party speech providers: vad@1.0.0, stt@1.0.0, stt.realtime@1.0.0 and tts@1.0.0
(docs/PROVIDERS.md, docs/SPEECH.md).

They are facades over the node's mounted core serving, never runtimes of their own: vad@ runs
the realtime edge's Silero VAD and turn machine, stt@ and tts@ submit the transcription and
speech routes' own workloads through the API context. An API node registers them ahead of
every extension (`first_party_providers`, source `FIRST_PARTY_SOURCE`), so they win their
id@version. vad@ is advertised always; stt@, stt.realtime@ and tts@ only while a ready model
of their kind is placed (`advertising`).

- `framing.py`, `advertising.py`, `errors.py`, `bounds.py`: the pure parts and every bound.
- `vad.py`, `stt.py`, `stt_realtime.py`, `tts.py`: one provider each.

Lives under `skulk.api` because stt@ and tts@ need the API's command path; the providers
package (`skulk.extensions.providers`) never imports this.
"""

from __future__ import annotations

from typing import Any, Final

from skulk.api.speech_providers.advertising import SpeechTagSync, always_advertised
from skulk.api.speech_providers.common import ContextOf
from skulk.api.speech_providers.stt import SttProvider
from skulk.api.speech_providers.stt_realtime import SttRealtimeProvider
from skulk.api.speech_providers.tts import TtsProvider
from skulk.api.speech_providers.vad import VadProvider

FIRST_PARTY_SOURCE: Final = "skulk"
"""The registry's source name for first-party providers (diagnostics list it)."""


def first_party_providers(context_of: ContextOf) -> list[Any]:
    """The providers an API node registers before its extensions'."""
    return [VadProvider(), SttProvider(context_of), SttRealtimeProvider(context_of), TtsProvider(context_of)]


def first_party_stats(providers: list[Any]) -> list[dict[str, Any]]:
    """The bounded queues of the providers that hold any (`/v1/diagnostics/node`)."""
    return [provider.stats() for provider in providers if callable(getattr(provider, "stats", None))]


__all__ = ["FIRST_PARTY_SOURCE", "SpeechTagSync", "always_advertised", "first_party_providers", "first_party_stats"]
