"""PCM16 at any vad@ rate re-framed into the classifier's windows: 16 kHz, 512 samples each.

Pure and incremental: `frame(state, chunk)` returns the windows the chunk completes and the
state carrying what is left (samples short of a resampling block or of a whole window), so
cutting a stream anywhere gives exactly the windows one call over all of it gives. 32 and
48 kHz are averaged down by whole blocks (2 or 3 samples to one: the mean also damps what
16 kHz cannot hold); 8 kHz is doubled by linear interpolation (each sample preceded by the
mean of it and the one before). Never reads a clock, never keeps more than one window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from skulk.api.realtime.audio import VAD_RATE
from skulk.api.realtime.turns import WINDOW_SAMPLES

Pcm = npt.NDArray[np.int16]


def _empty() -> Pcm:
    return np.zeros(0, dtype=np.int16)


@dataclass(frozen=True)
class FrameState:
    rate: int
    carry: Pcm = field(default_factory=_empty)
    """Input samples not yet resampled (32/48 kHz: short of a block; 8 kHz: the last sample)."""
    pending: Pcm = field(default_factory=_empty)
    """16 kHz samples short of a whole window."""
    samples_in: int = 0
    """Input samples taken so far (the call's audio duration, at `rate`)."""


def to_vad_rate(rate: int, carry: Pcm, chunk: Pcm) -> tuple[Pcm, Pcm]:
    """`chunk` (after `carry`) at 16 kHz, and the new carry. `rate` is one of `VAD_RATES`."""
    if rate == VAD_RATE:
        return chunk.copy(), _empty()
    if rate > VAD_RATE:
        factor = rate // VAD_RATE
        samples = np.concatenate([carry, chunk]) if carry.size else chunk
        whole = samples.size - samples.size % factor
        blocks = samples[:whole].astype(np.int32).reshape(-1, factor)
        return (blocks.sum(axis=1) // factor).astype(np.int16), samples[whole:].copy()
    if not chunk.size:
        return _empty(), carry
    wide = chunk.astype(np.int32)
    before = np.concatenate([carry.astype(np.int32) if carry.size else wide[:1], wide[:-1]])
    out = np.empty((wide.size, 2), dtype=np.int32)
    out[:, 0] = (before + wide) // 2
    out[:, 1] = wide
    return out.reshape(-1).astype(np.int16), chunk[-1:].copy()


def frame(state: FrameState, chunk: Pcm) -> tuple[FrameState, list[Pcm]]:
    """The whole 16 kHz windows `chunk` completes, in order, and the state after it."""
    resampled, carry = to_vad_rate(state.rate, state.carry, chunk)
    samples = np.concatenate([state.pending, resampled]) if state.pending.size else resampled
    count = samples.size // WINDOW_SAMPLES
    windows = [samples[i * WINDOW_SAMPLES:(i + 1) * WINDOW_SAMPLES] for i in range(count)]
    pending = samples[count * WINDOW_SAMPLES:].copy()
    return FrameState(state.rate, carry, pending, state.samples_in + int(chunk.size)), windows


__all__ = ["FrameState", "Pcm", "frame", "to_vad_rate"]
