"""The pure pieces of the speech-to-text routes, table by table: the multipart form read from
memory, the upload probe (real files: WAV, FLAC and MP3 encoded here, text, empty, too long),
the form's own checks and the card's refusals, and OpenAI's response formats (SRT/WebVTT
timestamps, verbose_json, the stream's events)."""

from __future__ import annotations

import io
import random
import wave

import httpx
import pytest

from skulk.api.adapters.openai_audio import delta_event, done_event, rendered, srt, timestamp, vtt
from skulk.api.audio_probe import MAX_AUDIO_SECONDS, AudioRefused, probe_audio, size_refusal
from skulk.api.errors import InvalidRequest, PayloadTooLarge
from skulk.api.multipart_form import MAX_FORM_FIELDS, parse_form
from skulk.api.routes.transcriptions import read_form, request_refusal
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import AudioSection
from skulk.shared.types.workload_io import (
    MAX_AUDIO_UPLOAD_BYTES,
    TranscriptionResult,
    TranscriptSegment,
    TranscriptWord,
)
from tests.speech_kit import silent_wav, tiny_whisper_card


def tone_wav(seconds: float, rate: int = 16000, width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(bytes(random.Random(3).randbytes(width * int(rate * seconds))))
    return out.getvalue()


def encoded(codec: str, container: str, seconds: float = 1.0, rate: int = 16000) -> bytes:
    """`seconds` of noise encoded by PyAV's bundled FFmpeg."""
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="mono")  # type: ignore[call-arg]
        samples = (np.random.default_rng(5).standard_normal(int(rate * seconds)) * 3000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):  # type: ignore[attr-defined]
            file.mux(packet)
        for packet in stream.encode(None):  # type: ignore[attr-defined]
            file.mux(packet)
    return out.getvalue()


# -- the form -----------------------------------------------------------------------------


def form_body(files: dict | None = None, **data) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://node/v1/audio/transcriptions", files=files or {}, data=data)
    return request.headers["content-type"], request.read()


def test_a_form_is_read_from_memory_byte_exact():
    noise = random.Random(11).randbytes(300_000)  # every byte value, CR and LF included
    content_type, body = form_body({"file": ("noise.wav", noise, "audio/wav")}, model="m",
                                   **{"timestamp_granularities[]": ["word", "segment"]})
    fields = parse_form(content_type, body)
    assert fields["file"][0].data == noise and fields["file"][0].filename == "noise.wav"
    assert [p.text for p in fields["timestamp_granularities[]"]] == ["word", "segment"]
    assert fields["model"][0].text == "m" and fields["model"][0].filename is None


@pytest.mark.parametrize(("content_type", "body", "message"), [
    ("application/json", b"{}", "multipart/form-data"),
    (None, b"", "multipart/form-data"),
    ("multipart/form-data", b"--x\r\n", "no boundary"),
])
def test_a_body_that_is_no_form_is_refused(content_type, body, message):
    with pytest.raises(InvalidRequest, match=message) as refused:
        parse_form(content_type, body)
    assert refused.value.code == "invalid_form"


def test_a_form_with_too_many_fields_is_refused():
    content_type, body = form_body({"file": ("a.wav", b"RIFF")}, **{f"f{i}": "x" for i in range(MAX_FORM_FIELDS)})
    with pytest.raises(InvalidRequest, match="more than"):
        parse_form(content_type, body)


def read(task="transcribe", file=("a.wav", b"RIFF"), **data):
    """`file=None`: 'file' sent as a text field, not a file."""
    content_type, body = form_body({"file": file or (None, b"not a file")}, **data)
    return read_form(parse_form(content_type, body), task)


def test_a_form_read_with_its_defaults():
    form = read(model="local/tiny-whisper")
    assert (form.model, form.response_format, form.temperature, form.stream, form.words, form.language) == (
        "local/tiny-whisper", "json", 0.0, False, False, None)
    full = read(model="m", language="de", prompt="Skulk", response_format="verbose_json", temperature="0.4",
                stream="true", **{"timestamp_granularities[]": ["word"]})
    assert (full.language, full.prompt, full.temperature, full.stream, full.words) == ("de", "Skulk", 0.4, True, True)


@pytest.mark.parametrize(("task", "fields", "param"), [
    ("transcribe", {"file": None, "model": "m"}, "file"),
    ("transcribe", {"file": ("a.wav", b"x")}, "model"),
    ("transcribe", {"model": "m", "response_format": "mp3"}, "response_format"),
    ("transcribe", {"model": "m", "temperature": "hot"}, "temperature"),
    ("transcribe", {"model": "m", "temperature": "1.5"}, "temperature"),
    ("transcribe", {"model": "m", "stream": "maybe"}, "stream"),
    ("transcribe", {"model": "m", "prompt": "x" * 4097}, "prompt"),
    ("transcribe", {"model": "m", "timestamp_granularities[]": ["char"], "response_format": "verbose_json"},
     "timestamp_granularities[]"),
    ("transcribe", {"model": "m", "timestamp_granularities[]": ["word"]}, "timestamp_granularities[]"),
    ("transcribe", {"model": "m", "include[]": ["logprobs"]}, "include[]"),
    ("translate", {"model": "m", "language": "de"}, "language"),
    ("translate", {"model": "m", "stream": "true"}, "stream"),
])
def test_bad_forms_are_refused_naming_the_field(task, fields, param):
    fields = dict(fields)
    file = fields.pop("file", ("a.wav", b"RIFF"))
    with pytest.raises(InvalidRequest) as refused:
        read(task, file=file, **fields)
    assert refused.value.param == param


def card_with(**audio):
    return tiny_whisper_card().model_copy(update={"audio": AudioSection(sample_rate=16000, **audio)})


WHISPER = frozenset({"en", "de", "fr"})


@pytest.mark.parametrize(("task", "fields", "audio", "code"), [
    ("transcribe", {}, {}, None),
    ("translate", {}, {}, "translation_unsupported"),
    ("translate", {}, {"supports_translation": True}, None),
    ("transcribe", {"stream": "true"}, {}, "streaming_unsupported"),
    ("transcribe", {"stream": "true"}, {"supports_streaming": True}, None),
    ("transcribe", {"stream": "true", "response_format": "srt"}, {"supports_streaming": True}, None),
    ("transcribe", {"response_format": "verbose_json", "timestamp_granularities[]": ["word"]}, {},
     "word_timestamps_unsupported"),
    ("transcribe", {"language": "de"}, {}, None),
    ("transcribe", {"language": "xx"}, {}, "unsupported_language"),
    ("transcribe", {"language": "de"}, {"languages": ("en",)}, "unsupported_language"),
])
def test_what_the_card_does_not_declare_is_refused(task, fields, audio, code):
    form = read(task, model="m", **fields)
    refusal = request_refusal(form, "m", card_with(**audio), WHISPER)
    if fields.get("response_format") == "srt":
        assert refusal is not None and refusal.param == "response_format"  # a stream is text only
        return
    assert (refusal is None) if code is None else (refusal is not None and refusal.code == code)


def test_without_whisper_s_table_only_the_card_s_languages_are_checked_here():
    assert request_refusal(read(model="m", language="xx"), "m", card_with(), None) is None  # the engine decides
    refusal = request_refusal(read(model="m", language="de"), "m", card_with(languages=("en",)), None)
    assert refusal is not None and refusal.code == "unsupported_language"


def test_a_model_that_does_not_hear_is_refused_by_name():
    llama = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    refusal = request_refusal(read(model="local/tiny-llama-gguf"), "local/tiny-llama-gguf", llama, WHISPER)
    assert refusal is not None and refusal.code == "model_not_stt" and "local/tiny-llama-gguf" in refusal.message


# -- the probe ----------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "codec", "seconds"), [
    (lambda: tone_wav(1.5), "pcm_s16le", 1.5),
    (lambda: tone_wav(0.25, rate=8000, width=1), "pcm_u8", 0.25),
    (lambda: encoded("flac", "flac", 2.0), "flac", 2.0),
    (lambda: encoded("libmp3lame", "mp3", 2.0), "mp3", 2.0),
])
def test_audio_is_measured_by_decoding_it(make, codec, seconds):
    probe = probe_audio(make())
    assert probe.codec.startswith(codec.split("_")[0][:3]) and probe.channels == 1
    assert probe.duration_s == pytest.approx(seconds, abs=0.1)  # MP3 pads a frame


@pytest.mark.parametrize(("data", "code"), [
    (b"", "audio_empty"),
    (silent_wav(0), "audio_empty"),
    (b"these are words, not audio " * 40, "audio_invalid"),
    (tone_wav(1.0)[:30], "audio_invalid"),
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "audio_invalid"),
])
def test_what_is_not_audio_is_refused_typed(data, code):
    with pytest.raises(AudioRefused) as refused:
        probe_audio(data)
    assert refused.value.code == code and refused.value.param == "file"


def test_audio_longer_than_the_bound_is_refused():
    # 8 kHz 8-bit mono: the bound plus a second fits well under the upload limit.
    with pytest.raises(AudioRefused) as refused:
        probe_audio(tone_wav(MAX_AUDIO_SECONDS + 1, rate=8000, width=1))
    assert refused.value.code == "audio_too_long"


def test_a_file_over_the_upload_limit_is_a_413():
    assert size_refusal(MAX_AUDIO_UPLOAD_BYTES) is None
    refusal = size_refusal(MAX_AUDIO_UPLOAD_BYTES + 1)
    assert isinstance(refusal, PayloadTooLarge) and refusal.code == "audio_too_large"


# -- the formats --------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "decimal", "text"), [
    (0.0, ",", "00:00:00,000"),
    (1.42, ",", "00:00:01,420"),
    (59.9996, ".", "00:01:00.000"),
    (3725.5, ".", "01:02:05.500"),
    (-0.2, ",", "00:00:00,000"),
    (36_000.001, ",", "10:00:00,001"),
])
def test_timestamps(seconds, decimal, text):
    assert timestamp(seconds, decimal) == text


RESULT = TranscriptionResult(
    text="Hello there. General Kenobi.", language="en", duration=3.2,
    segments=[
        TranscriptSegment(id=0, start=0.0, end=1.5, text=" Hello there.",
                          words=[TranscriptWord(word=" Hello", start=0.0, end=0.7),
                                 TranscriptWord(word=" there.", start=0.7, end=1.5)]),
        TranscriptSegment(id=1, start=1.5, end=3.2, text=" General Kenobi."),
    ],
)


def test_srt_and_vtt():
    assert srt(RESULT) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                           "2\n00:00:01,500 --> 00:00:03,200\nGeneral Kenobi.\n")
    assert vtt(RESULT) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                           "00:00:01.500 --> 00:00:03.200\nGeneral Kenobi.\n")


def test_json_text_and_verbose_json():
    assert rendered(RESULT, "json", "transcribe", False) == {"text": RESULT.text,
                                                            "usage": {"type": "duration", "seconds": 4}}
    assert rendered(RESULT, "text", "transcribe", False) == RESULT.text
    verbose = rendered(RESULT, "verbose_json", "translate", True)
    assert isinstance(verbose, dict)
    assert (verbose["task"], verbose["language"], verbose["duration"]) == ("translate", "en", 3.2)
    assert [s["text"] for s in verbose["segments"]] == [" Hello there.", " General Kenobi."]
    assert verbose["words"] == [{"word": " Hello", "start": 0.0, "end": 0.7},
                                {"word": " there.", "start": 0.7, "end": 1.5}]
    assert "words" not in rendered(RESULT, "verbose_json", "transcribe", False)  # type: ignore[operator]


def test_stream_events():
    assert delta_event(" Hello") == {"type": "transcript.text.delta", "delta": " Hello"}
    assert done_event("Hello") == {"type": "transcript.text.done", "text": "Hello"}
