"""Silero VAD (the ONNX model faster_whisper ships) over a stream of 16 kHz audio: each
512-sample window gets a speech probability, its recurrent state carried from the last.

The model is loaded once per process and shared (an onnxruntime session runs concurrently);
each stream keeps its own recurrent state, the 64-sample context the model sees before a
window, and the samples short of a whole window. Turn-taking is `skulk.api.realtime.turns`.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import numpy as np
import numpy.typing as npt

from skulk.api.realtime.turns import WINDOW_SAMPLES

CONTEXT_SAMPLES = 64
"""Samples of the previous window the model sees before each window (at 16 kHz)."""
STATE_SHAPE = (1, 1, 128)


def model_path() -> str:
    """The Silero VAD model faster_whisper ships (a dependency of every node)."""
    return str(importlib.resources.files("faster_whisper") / "assets" / "silero_vad_v6.onnx")


@functools.cache
def _session() -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(model_path(), providers=["CPUExecutionProvider"], sess_options=options)


class VadStream:
    """One audio stream's classifier: `push(samples)` -> the probabilities of the windows it
    completed, in order."""

    def __init__(self) -> None:
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: npt.NDArray[np.float32]) -> list[float]:
        audio = np.concatenate([self._pending, samples]) if self._pending.size else samples
        count = audio.size // WINDOW_SAMPLES
        self._pending = audio[count * WINDOW_SAMPLES:].copy()
        if not count:
            return []
        windows = audio[: count * WINDOW_SAMPLES].reshape(count, WINDOW_SAMPLES)
        contexts = np.concatenate([self._context[None, :], windows[:-1, -CONTEXT_SAMPLES:]], axis=0)
        batch = np.concatenate([contexts, windows], axis=1).astype(np.float32)
        self._context = windows[-1, -CONTEXT_SAMPLES:].copy()
        probabilities, self._h, self._c = _session().run(None, {"input": batch, "h": self._h, "c": self._c})
        return [float(p) for p in np.asarray(probabilities).reshape(-1)]


__all__ = ["CONTEXT_SAMPLES", "VadStream", "model_path"]
