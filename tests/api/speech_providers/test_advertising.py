"""Which speech tags a node advertises: vad@ always, stt@ / tts@ only with a ready model."""

from __future__ import annotations

import pytest

from skulk.api.speech_providers.advertising import (
    STT_REALTIME_TAG,
    STT_TAG,
    TTS_TAG,
    VAD_TAG,
    SpeechTagSync,
    always_advertised,
    ready_models,
    speech_tags,
    tag_changes,
)
from skulk.extensions.capability_tags import CapabilityTags
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State

CARDS = {
    card.model_id: card
    for card in (load_card(builtin_cards_dir() / f"local--{name}.toml") for name in ("tiny-whisper", "tiny-piper",
                                                                                      "tiny-llama"))
}
STT, TTS, CHAT = "local/tiny-whisper", "local/tiny-piper", "local/tiny-llama"


def _state(placed: dict[str, str | None]) -> State:
    """One single-runner instance per model; its runner's state (None: not reported yet)."""
    instances: dict[InstanceId, Instance] = {}
    runners: dict[RunnerId, RunnerStatus] = {}
    for n, (model, runner_state) in enumerate(placed.items()):
        runner, instance_id = RunnerId(f"r{n}"), InstanceId(f"i{n}")
        instances[instance_id] = Instance(
            instance_id=instance_id, model_id=ModelId(model), sharding="Pipeline", context_token_limit=1024,
            shards=[ShardAssignment(node_id=NodeId("n"), runner_id=runner, rank=0, world_size=1, start_layer=0,
                                    end_layer=1, backend="cpu")])
        if runner_state is not None:
            runners[runner] = RunnerStatus.model_validate({"state": runner_state})
    return State(instances=instances, runners=runners)


@pytest.mark.parametrize(
    ("placed", "tags"),
    [
        ({}, {VAD_TAG}),  # no model: vad@ alone
        ({CHAT: "Ready"}, {VAD_TAG}),  # a chat model speaks neither
        ({STT: "Ready"}, {VAD_TAG, STT_TAG, STT_REALTIME_TAG}),  # its card declares supports_realtime
        ({TTS: "Running"}, {VAD_TAG, TTS_TAG}),
        ({STT: "Loading", TTS: None}, {VAD_TAG}),  # placed, not ready yet
        ({STT: "Failed", TTS: "Ready"}, {VAD_TAG, TTS_TAG}),
        ({STT: "Ready", TTS: "Ready", CHAT: "Ready"}, {VAD_TAG, STT_TAG, STT_REALTIME_TAG, TTS_TAG}),
    ],
)
def test_speech_tags_follow_ready_models(placed, tags) -> None:
    assert speech_tags(_state(placed), CARDS) == tags


def test_ready_models_are_sorted_by_kind() -> None:
    state = _state({STT: "Ready", TTS: "Ready"})
    assert ready_models(state, CARDS, "stt") == (STT,)
    assert ready_models(state, CARDS, "tts") == (TTS,)
    assert ready_models(state, CARDS, "stt_realtime") == (STT,)
    whisper = CARDS[ModelId(STT)]
    assert whisper.audio is not None
    batch_only = {**CARDS, ModelId(STT): whisper.model_copy(
        update={"audio": whisper.audio.model_copy(update={"supports_realtime": False})})}
    assert ready_models(state, batch_only, "stt") == (STT,) and ready_models(state, batch_only, "stt_realtime") == ()


@pytest.mark.parametrize(
    ("current", "wanted", "add", "drop"),
    [
        (set(), {VAD_TAG}, set(), set()),  # vad@ is advertised at start, not here
        ({VAD_TAG, "echo@1.0.0"}, {VAD_TAG, STT_TAG}, {STT_TAG}, set()),
        ({VAD_TAG, STT_TAG, TTS_TAG, "echo@1.0.0"}, {VAD_TAG, TTS_TAG}, set(), {STT_TAG}),  # others untouched
    ],
)
def test_tag_changes_touch_only_the_model_backed_tags(current, wanted, add, drop) -> None:
    assert tag_changes(frozenset(current), frozenset(wanted)) == (frozenset(add), frozenset(drop))


def test_always_advertised_leaves_the_model_backed_tags_out() -> None:
    assert always_advertised((STT_TAG, "echo@1.0.0", TTS_TAG, VAD_TAG)) == ("echo@1.0.0", VAD_TAG)


def test_the_sync_advertises_and_withdraws() -> None:
    tags = CapabilityTags()
    tags.advertise(VAD_TAG)
    sync = SpeechTagSync(tags)
    sync.sync(_state({STT: "Ready"}), CARDS)
    assert tags.current() == {VAD_TAG, STT_TAG, STT_REALTIME_TAG}
    sync.sync(_state({STT: "Failed"}), CARDS)
    assert tags.current() == {VAD_TAG}
