"""First-party speech providers: registered ahead of extensions, they win their id@version;
a core serving failure becomes the contract's typed error by one table."""

from __future__ import annotations

import pytest

from skulk.api.errors import ApiError, ClusterNotReady, InvalidRequest, ModelNotFound, PayloadTooLarge, StreamFailed
from skulk.api.speech_providers import FIRST_PARTY_SOURCE, first_party_providers
from skulk.api.speech_providers.errors import capability_error
from skulk.api.speech_providers.vad import DESCRIPTOR as VAD
from skulk.extensions.providers.registry import registry_from


class Impostor:
    """An extension claiming vad@1.0.0 with its own contract."""

    def descriptors(self) -> list[dict]:
        return [{**VAD.to_wire(), "description": "not the real one"}]

    async def handle_stream(self, *_args):  # pragma: no cover - never registered
        yield {}


def test_first_party_providers_win_their_id_at_version() -> None:
    registry = registry_from([(FIRST_PARTY_SOURCE, lambda: first_party_providers(lambda: None)),
                              ("impostor", lambda: [Impostor()])])
    assert registry.capability_tags() == ("stt.realtime@1.0.0", "stt@1.0.0", "tts@1.0.0", "vad@1.0.0")
    entry = registry.get("vad", "1.0.0")
    assert entry is not None and entry.source == FIRST_PARTY_SOURCE and entry.descriptor.revision == VAD.revision
    assert [(r.source, r.capability) for r in registry.refused] == [("impostor", "vad@1.0.0")]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("bad voice", param="voice", code="unknown_voice"), "input_invalid"),
        (PayloadTooLarge("too big"), "payload_too_large"),
        (ModelNotFound("m"), "admission_refused"),
        (ClusterNotReady("no master"), "admission_refused"),
        (StreamFailed("runner_failed", "it crashed"), "provider_failed"),
        (StreamFailed("cancelled", "gone", outcome="cancelled"), "cancelled"),
    ],
)
def test_core_failures_map_to_capability_kinds(error: ApiError, kind: str) -> None:
    mapped = capability_error(error)
    assert mapped.kind == kind and error.message in mapped.message
