"""vad@'s re-framing: any rate to 16 kHz windows of 512, chunk boundaries invisible."""

from __future__ import annotations

import numpy as np
import pytest

from skulk.api.realtime.turns import WINDOW_SAMPLES
from skulk.api.speech_providers.bounds import VAD_RATES
from skulk.api.speech_providers.framing import FrameState, frame, to_vad_rate


def _pcm(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int16)


@pytest.mark.parametrize(
    ("rate", "chunk", "out", "carry"),
    [
        (16_000, [1, 2, 3], [1, 2, 3], []),
        (32_000, [2, 4, 6, 8, 10], [3, 7], [10]),  # pairs averaged, the odd one carried
        (48_000, [3, 3, 3, 6, 6, 6, 9], [3, 6], [9]),  # threes averaged
        (8_000, [10, 20, 30], [10, 10, 15, 20, 25, 30], [30]),  # doubled: midpoint, sample
    ],
)
def test_to_vad_rate(rate, chunk, out, carry) -> None:
    got, left = to_vad_rate(rate, _pcm([]), _pcm(chunk))
    assert got.tolist() == out
    assert left.tolist() == carry


@pytest.mark.parametrize("rate", VAD_RATES)
@pytest.mark.parametrize("cuts", [[1], [7, 300], [511, 512, 1], [1000, 3, 5000]])
def test_cutting_the_stream_anywhere_gives_the_same_windows(rate, cuts) -> None:
    rng = np.random.default_rng(rate)
    samples = rng.integers(-20_000, 20_000, size=rate // 4, dtype=np.int16)  # 250 ms
    _, whole = frame(FrameState(rate), samples)
    state, pieces, at = FrameState(rate), [], 0
    for size in [*cuts, samples.size]:
        state, windows = frame(state, samples[at:at + size])
        pieces += windows
        at = min(samples.size, at + size)
    assert len(pieces) == len(whole) == (rate // 4) * 16_000 // rate // WINDOW_SAMPLES
    assert all(np.array_equal(a, b) for a, b in zip(pieces, whole, strict=True))
    assert all(w.size == WINDOW_SAMPLES for w in pieces)
    assert state.samples_in == samples.size


def test_a_chunk_short_of_a_window_yields_none_and_keeps_it() -> None:
    state, windows = frame(FrameState(16_000), _pcm([1] * (WINDOW_SAMPLES - 1)))
    assert windows == [] and state.pending.size == WINDOW_SAMPLES - 1
    state, windows = frame(state, _pcm([2]))
    assert len(windows) == 1 and windows[0][-1] == 2 and state.pending.size == 0
