"""Which first-party speech capability tags this node advertises, decided from State.

vad@ needs no model and is always advertised. stt@ and tts@ are advertised only while a
placed model whose card speaks that capability has an instance every runner of which serves
(`skulk.shared.serving.serving`): a tag is a promise peers route on, so it never outlives
the capacity behind it. `speech_tags` and `tag_changes` are pure; `SpeechTagSync` applies
the difference to the node's tag set (the node calls it as events apply). The descriptors
stay discoverable either way (`GET /v1/capabilities`); a call with no capacity is refused
`admission_refused` by the provider's `admit`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Literal

from skulk.extensions.capability_tags import CapabilityTagError, CapabilityTags
from skulk.shared.serving import serving
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import ModelId
from skulk.shared.types.state import State

log = logging.getLogger(__name__)

SpeechKind = Literal["stt", "tts", "stt_realtime"]

VAD_TAG: Final = "vad@1.0.0"
STT_TAG: Final = "stt@1.0.0"
TTS_TAG: Final = "tts@1.0.0"
STT_REALTIME_TAG: Final = "stt.realtime@1.0.0"
MODEL_BACKED_TAGS: Final[Mapping[str, SpeechKind]] = {STT_TAG: "stt", TTS_TAG: "tts",
                                                      STT_REALTIME_TAG: "stt_realtime"}
"""The tags advertised only while a ready model of their kind is placed."""


def eligible(card: ModelCard | None, kind: SpeechKind) -> bool:
    """Does the card serve `kind`: `stt` / `tts` in its capabilities with an audio section;
    `stt_realtime`: an `stt` card declaring `audio.supports_realtime` (the realtime edge's gate)."""
    if card is None or card.audio is None:
        return False
    if kind == "stt_realtime":
        return "stt" in card.capabilities and card.audio.supports_realtime
    return kind in card.capabilities


def ready_models(state: State, cards: Mapping[ModelId, ModelCard], kind: SpeechKind) -> tuple[str, ...]:
    """Placed models whose card serves `kind` (`eligible`) with a serving instance, sorted
    (the first is the default when a call names none)."""
    ready: set[str] = set()
    for instance in state.instances.values():
        if not eligible(cards.get(instance.model_id), kind):
            continue
        if serving(state, instance):
            ready.add(str(instance.model_id))
    return tuple(sorted(ready))


def speech_tags(state: State, cards: Mapping[ModelId, ModelCard]) -> frozenset[str]:
    """The first-party speech tags this node should advertise now."""
    return frozenset({VAD_TAG} | {tag for tag, kind in MODEL_BACKED_TAGS.items() if ready_models(state, cards, kind)})


def tag_changes(current: frozenset[str], wanted: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(to advertise, to withdraw) among the model-backed tags; other tags are not ours."""
    managed = frozenset(MODEL_BACKED_TAGS)
    return (wanted & managed) - current, (current & managed) - wanted


def always_advertised(tags: tuple[str, ...]) -> tuple[str, ...]:
    """A registry's tags less the model-backed ones (advertised by `SpeechTagSync` instead)."""
    return tuple(tag for tag in tags if tag not in MODEL_BACKED_TAGS)


class SpeechTagSync:
    """Keeps the node's model-backed speech tags equal to `speech_tags` (one line per change)."""

    def __init__(self, tags: CapabilityTags) -> None:
        self._tags = tags

    def sync(self, state: State, cards: Mapping[ModelId, ModelCard]) -> None:
        add, drop = tag_changes(self._tags.current(), speech_tags(state, cards))
        for tag in sorted(drop):
            self._tags.withdraw(tag)
            log.info("capability %s withdrawn: no ready model serves it", tag)
        for tag in sorted(add):
            try:
                self._tags.advertise(tag)
                log.info("capability %s advertised: a ready model serves it", tag)
            except CapabilityTagError as exc:
                log.warning("capability %s served but not advertised: %s", tag, exc)


__all__ = [
    "MODEL_BACKED_TAGS",
    "STT_REALTIME_TAG",
    "STT_TAG",
    "TTS_TAG",
    "VAD_TAG",
    "SpeechTagSync",
    "always_advertised",
    "eligible",
    "ready_models",
    "speech_tags",
    "tag_changes",
]
