"""stt.realtime@'s held audio: a turn's samples (preroll included) are cut from a buffer that
keeps only what an open or opening turn can reach."""

from __future__ import annotations

import numpy as np
import pytest

from skulk.api.realtime.turns import WINDOW_MS, WINDOW_SAMPLES, TurnSettings, TurnState, step
from skulk.api.speech_providers.stt_realtime import Held, cut, hold, lookback_windows

SETTINGS = TurnSettings(prefix_padding_ms=300, min_speech_ms=96, silence_duration_ms=160)


def _window(index: int) -> np.ndarray:
    return np.full(WINDOW_SAMPLES, index % 30_000, dtype=np.int16)  # each window its own value


@pytest.mark.parametrize(("prefix", "min_speech", "windows"), [(300, 96, 14), (0, 32, 2), (320, 64, 13)])
def test_lookback_covers_the_preroll_and_the_opening_run(prefix, min_speech, windows) -> None:
    assert lookback_windows(TurnSettings(prefix_padding_ms=prefix, min_speech_ms=min_speech)) == windows


def test_outside_a_turn_only_the_lookback_is_kept() -> None:
    held = Held()
    for index in range(100):
        held = hold(held, _window(index), SETTINGS, TurnState(windows=index))
    assert held.samples.size == lookback_windows(SETTINGS) * WINDOW_SAMPLES
    assert held.first_window == 100 - lookback_windows(SETTINGS)


def test_a_turns_audio_is_cut_whole_with_its_preroll() -> None:
    probabilities = [0.0] * 40 + [0.9] * 20 + [0.0] * 10  # speech in windows 40-59
    held, turns, stopped, pcm = Held(), TurnState(), None, None
    for index, probability in enumerate(probabilities):
        held = hold(held, _window(index), SETTINGS, turns)
        turns, events = step(SETTINGS, turns, probability)
        for event in events:
            if event.kind == "speech_stopped":  # cut as the provider does, at the stop
                stopped, pcm = event, cut(held, event.start_ms, event.ms)
    assert stopped is not None and pcm is not None
    assert stopped.start_ms == 40 * WINDOW_MS - 300  # the preroll before the first speech window
    assert pcm.size == (stopped.ms - stopped.start_ms) * 16
    first_window = stopped.start_ms // WINDOW_MS
    assert pcm[0] == first_window and pcm[-1] == stopped.ms // WINDOW_MS - 1
