"""Server VAD turn-taking: one speech probability per classifier window in, turn events out.

A pure state machine (`step`): no clock, no audio, only the probability of each 32 ms
window in order. Speech begins once `min_speech_ms` of windows at or above `threshold` run
unbroken (a click or a cough does not open a turn); the turn is reported as starting
`prefix_padding_ms` before its first speech window (the audio sent to the model includes
that lead-in, as OpenAI's does). It ends once `silence_duration_ms` of windows fall below
the release threshold (`threshold - RELEASE_MARGIN`, so a voice hovering at the threshold
does not flap), or when it has run `max_utterance_ms`; either way the utterance is
committed there. Times are milliseconds from the start of the session's audio.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

WINDOW_SAMPLES = 512
"""Samples per classifier window at 16 kHz (Silero's window at that rate)."""
WINDOW_MS = 32
"""One window's duration."""
RELEASE_MARGIN = 0.15
"""How far below `threshold` a window must fall to count as silence (Silero's own
hysteresis)."""
MIN_SPEECH_MS = 96
"""Default least run of speech windows that opens a turn (three windows)."""
MAX_UTTERANCE_MS = 30_000
"""Default longest turn: a turn that runs this long is committed there (Whisper hears 30 s
at a time) and listening goes on."""


@dataclass(frozen=True)
class TurnSettings:
    """OpenAI's `server_vad` settings, plus our two bounds."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_ms: int = MIN_SPEECH_MS
    max_utterance_ms: int = MAX_UTTERANCE_MS


@dataclass(frozen=True)
class TurnState:
    windows: int = 0
    """Windows classified so far in the session."""
    speech_run: int = 0
    """Consecutive speech windows while not in a turn."""
    start_ms: int | None = None
    """The open turn's start (prefix padding included); None when not in a turn."""
    silence_run: int = 0
    """Consecutive silent windows inside the open turn."""


@dataclass(frozen=True)
class TurnEvent:
    kind: Literal["speech_started", "speech_stopped"]
    ms: int
    """speech_started: the turn's audio start; speech_stopped: its audio end (commit there)."""
    start_ms: int = 0
    """speech_stopped: the start of the turn it ends."""


def step(settings: TurnSettings, state: TurnState, probability: float) -> tuple[TurnState, tuple[TurnEvent, ...]]:
    """The state after one more window of `probability`, and the events it causes."""
    window = state.windows
    end_ms = (window + 1) * WINDOW_MS
    state = replace(state, windows=window + 1)
    if state.start_ms is None:
        if probability < settings.threshold:
            return replace(state, speech_run=0), ()
        run = state.speech_run + 1
        if run * WINDOW_MS < settings.min_speech_ms:
            return replace(state, speech_run=run), ()
        first_speech_ms = (window + 1 - run) * WINDOW_MS
        start = max(0, first_speech_ms - settings.prefix_padding_ms)
        return replace(state, speech_run=0, start_ms=start, silence_run=0), (TurnEvent("speech_started", start),)
    silent = probability < settings.threshold - RELEASE_MARGIN
    silence_run = state.silence_run + 1 if silent else 0
    if silence_run * WINDOW_MS >= settings.silence_duration_ms or end_ms - state.start_ms >= settings.max_utterance_ms:
        return (replace(state, start_ms=None, silence_run=0, speech_run=0),
                (TurnEvent("speech_stopped", end_ms, state.start_ms),))
    return replace(state, silence_run=silence_run), ()


def steps(settings: TurnSettings, state: TurnState, probabilities: list[float]) -> tuple[TurnState, tuple[TurnEvent, ...]]:
    """`step` over several windows in order."""
    events: list[TurnEvent] = []
    for probability in probabilities:
        state, more = step(settings, state, probability)
        events.extend(more)
    return state, tuple(events)


__all__ = ["MAX_UTTERANCE_MS", "MIN_SPEECH_MS", "RELEASE_MARGIN", "WINDOW_MS", "WINDOW_SAMPLES", "TurnEvent",
           "TurnSettings", "TurnState", "step", "steps"]
