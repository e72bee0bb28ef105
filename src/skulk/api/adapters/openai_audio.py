"""OpenAI's audio transcription wire format: a transcript (`TranscriptionResult`) rendered
as each `response_format` OpenAI defines, and the SSE events of a streamed transcript.

Pure functions over the result; the route (`skulk.api.routes.transcriptions`) chooses. The
shapes follow OpenAI's API reference as its Python SDK parses them:

- `json`: `{"text", "usage"}`; `text`: the bare text;
- `verbose_json`: task, language (Whisper's code, 'en'), duration, text, segments (id,
  seek, start, end, text, tokens, temperature, avg_logprob, compression_ratio,
  no_speech_prob) and, when word timestamps were asked for, `words`;
- `srt` and `vtt`: one cue per segment, `HH:MM:SS,mmm` and `HH:MM:SS.mmm` times;
- streamed: `transcript.text.delta` per segment, then `transcript.text.done`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from skulk.shared.types.workload_io import TranscriptionResult, TranscriptSegment

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = ("json", "text", "srt", "verbose_json", "vtt")
STREAMED_FORMATS: tuple[ResponseFormat, ...] = ("json", "text")
"""The formats a streamed transcript may be asked in (OpenAI streams text deltas only)."""

MEDIA_TYPES: dict[ResponseFormat, str] = {
    "json": "application/json", "verbose_json": "application/json", "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8",
}


def timestamp(seconds: float, decimal: str) -> str:
    """`seconds` as HH:MM:SS<decimal>mmm (SRT: ',', WebVTT: '.'), rounded to the
    millisecond; negative times clamp to zero."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _cues(segments: list[TranscriptSegment], decimal: str, numbered: bool) -> list[str]:
    cues: list[str] = []
    for index, segment in enumerate(segments, start=1):
        times = f"{timestamp(segment.start, decimal)} --> {timestamp(segment.end, decimal)}"
        text = segment.text.strip()
        cues.append(f"{index}\n{times}\n{text}\n" if numbered else f"{times}\n{text}\n")
    return cues


def srt(result: TranscriptionResult) -> str:
    return "\n".join(_cues(result.segments, ",", numbered=True))


def vtt(result: TranscriptionResult) -> str:
    return "WEBVTT\n\n" + "\n".join(_cues(result.segments, ".", numbered=False))


def usage(result: TranscriptionResult) -> dict[str, Any]:
    """OpenAI's duration usage: whole seconds of audio, rounded up."""
    return {"type": "duration", "seconds": math.ceil(result.duration)}


def verbose_json(result: TranscriptionResult, task: str, words: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task, "language": result.language or "", "duration": result.duration, "text": result.text,
        "segments": [
            {"id": s.id, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
             "temperature": s.temperature or 0.0, "avg_logprob": s.avg_logprob or 0.0,
             "compression_ratio": s.compression_ratio or 0.0, "no_speech_prob": s.no_speech_prob or 0.0}
            for s in result.segments
        ],
        "usage": usage(result),
    }
    if words:
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in result.segments for w in s.words]
    return body


def rendered(result: TranscriptionResult, response_format: ResponseFormat, task: str,
             words: bool) -> dict[str, Any] | str:
    """The body of a transcript in `response_format`: a JSON object or text."""
    if response_format == "json":
        return {"text": result.text, "usage": usage(result)}
    if response_format == "verbose_json":
        return verbose_json(result, task, words)
    if response_format == "srt":
        return srt(result)
    if response_format == "vtt":
        return vtt(result)
    return result.text


def delta_event(text: str) -> dict[str, Any]:
    return {"type": "transcript.text.delta", "delta": text}


def done_event(text: str) -> dict[str, Any]:
    """The stream's last event (its `usage` is token usage in OpenAI's schema, which a
    Whisper transcript does not report, so it carries none)."""
    return {"type": "transcript.text.done", "text": text}


__all__ = [
    "MEDIA_TYPES",
    "RESPONSE_FORMATS",
    "STREAMED_FORMATS",
    "ResponseFormat",
    "delta_event",
    "done_event",
    "rendered",
    "srt",
    "timestamp",
    "verbose_json",
    "vtt",
]
