"""The speech-to-text routes against the scripted cluster, with the official OpenAI SDK:
the audio travels to the runner whole while the master's command is redacted, a streaming
card is asked for segments even for one answer (so a cancel can stop it between them), each
command is read to its terminal (TaskFinished, never a cancel), and the SSE stream parses."""

from __future__ import annotations

import openai
import pytest

from skulk.shared.types.commands import CancelCommand, RunWorkload, TaskFinished
from skulk.shared.types.ids import ModelId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import RunnerStatus, State
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.speech_kit import TINY_WHISPER, silent_wav, tiny_whisper_card

AUDIO = silent_wav(2.0)
STATE = State(
    instances={"i1": Instance(instance_id="i1", model_id=ModelId(TINY_WHISPER), sharding="Pipeline",
                              context_token_limit=448,
                              shards=[ShardAssignment(node_id="n1", runner_id="r1", rank=0, world_size=1,
                                                      start_layer=0, end_layer=2, backend="faster_whisper-cpu")])},
    runners={"r1": RunnerStatus(state="Ready")},
)


def app_and_cluster():
    card = tiny_whisper_card()
    return scripted_app([" Hello", " there."], state=STATE, context_fields={"get_cards": lambda: {card.model_id: card}})


def sdk(app) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=asgi_http(app), max_retries=0)


def ended(cluster, kind) -> list:
    return [c for c in cluster.commands if isinstance(c, kind)]


async def until(condition) -> None:
    import asyncio

    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not met")


async def test_one_answer_from_segments_with_the_audio_only_on_the_runner():
    app, cluster = app_and_cluster()
    result = await sdk(app).audio.transcriptions.create(model=TINY_WHISPER, file=("a.wav", AUDIO),
                                                        response_format="verbose_json", prompt="secret words")
    assert result.text == "Hello there." and result.duration == pytest.approx(2.0)
    assert [s.text for s in result.segments or []] == [" Hello", " there."]
    (command,) = ended(cluster, RunWorkload)
    assert command.params.audio_b64 == "" and command.params.prompt == ""  # the master's copy
    runner = cluster.params(RunWorkload)
    assert runner.audio_bytes() == AUDIO and runner.prompt == "secret words"
    assert runner.stream, "a streaming card is asked for segments: a cancel can stop it between them"
    await until(lambda: len(ended(cluster, TaskFinished)) == 1)
    assert ended(cluster, CancelCommand) == []


async def test_the_stream_parses_as_the_sdk_expects():
    app, cluster = app_and_cluster()
    stream = await sdk(app).audio.transcriptions.create(model=TINY_WHISPER, file=("a.wav", AUDIO), stream=True)
    events = [event async for event in stream]
    assert [(e.type, getattr(e, "delta", None)) for e in events[:-1]] == [
        ("transcript.text.delta", "Hello"), ("transcript.text.delta", " there.")]
    assert events[-1].type == "transcript.text.done" and events[-1].text == "Hello there."
    await until(lambda: len(ended(cluster, TaskFinished)) == 1)
    assert ended(cluster, CancelCommand) == []


@pytest.mark.parametrize(("fields", "code"), [
    ({"model": "local/tiny-llama"}, "model_not_found"),
    ({"file": ("notes.txt", b"plain words, no audio" * 20)}, "audio_invalid"),
    ({"language": "xx"}, "unsupported_language"),
])
async def test_refusals_come_before_any_command(fields, code):
    app, cluster = app_and_cluster()
    with pytest.raises(openai.APIStatusError) as refused:
        await sdk(app).audio.transcriptions.create(**{"model": TINY_WHISPER, "file": ("a.wav", AUDIO), **fields})
    assert refused.value.code == code and cluster.commands == []


async def test_a_speech_model_refuses_chat_by_name_before_any_command():
    app, cluster = app_and_cluster()
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(app).chat.completions.create(model=TINY_WHISPER, messages=[{"role": "user", "content": "hi"}])
    body = refused.value.body
    assert isinstance(body, dict) and body.get("code") == "unsupported_feature" and body.get("param") == "model"
    assert "faster_whisper engine, which does not support text generation" in str(body.get("message"))
    assert cluster.commands == []
