"""The generated Piper voice `local/tiny-piper`: a real Piper voice (an ONNX model and its
`.onnx.json` config, the pair `piper.voice.PiperVoice.load` reads) with small seeded random
weights, written offline, so that tests and a fresh node speak with no hub.

The graph takes exactly what Piper feeds a VITS voice: `input` (int64 [1, N] phoneme ids,
espeak-ng's IPA through the standard Piper id map), `input_lengths` (int64 [1]), `scales`
(float [3]: noise, length, noise_w) and `sid` (int64 [1], the speaker), and returns float
audio [1, 1, T]. Inside, a phoneme-id embedding plus a speaker embedding goes through two
tanh layers to a few oscillators per phoneme (amplitudes, frequencies); each phoneme holds
`HOP_LENGTH * length_scale` samples (Piper's hop: speed changes duration as it does in a
real voice); the oscillators' phase is integrated sample by sample (no clicks from phase
jumps) and the sum goes through tanh. Each speaker also has a pitch of its own, so the
voices are audibly different choices. It ignores the noise scales: the same text and voice
always give the same samples, which tests rely on.

Its version (a stale directory is regenerated) is its row in
`skulk.models.tiny_speech.SPEECH_GENERATORS`: bump it whenever the written files change.

It says nothing: it is a test voice whose sound depends on the text, the voice and the speed,
not a speech model. Never use it as one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from skulk.models import onnx_proto as onnx
from skulk.models.onnx_proto import FLOAT, INT64, Node, Value

MODEL_FILE = "model.onnx"
CONFIG_FILE = "model.onnx.json"
"""Piper's convention: the config is the model's path plus `.json`."""

SAMPLE_RATE = 22050
"""Hz: the rate of Piper's medium voices (the card's audio.sample_rate)."""
HOP_LENGTH = 256
"""Samples per phoneme id at length_scale 1 (Piper's hop length)."""
VOICES = ("amber", "birch", "cedar")
"""The speakers, by id (speaker_id_map); the first is the default."""
SPEAKER_PITCH = (0.8, 1.0, 1.3)
"""Each speaker's pitch factor on every oscillator: voices sound apart by construction."""
NUM_SYMBOLS = 256
"""Rows of the phoneme embedding (Piper voices declare 256; the id map uses fewer)."""
WIDTH = 32
"""Embedding and hidden width."""
OSCILLATORS = 4
FREQ_LOW_HZ, FREQ_SPAN_HZ = 90.0, 900.0
"""Each oscillator's frequency lies in [low, low + span) before the speaker's pitch."""
SEED = 31
OPSET = 17


def _weights() -> dict[str, np.ndarray]:
    from skulk.models.seeded_noise import uniform as _uniform  # the project's platform-stable seeded noise

    def w(name: str, *shape: int, std: float) -> np.ndarray:
        return _uniform(SEED, name, shape, std)

    return {
        "emb": w("emb", NUM_SYMBOLS, WIDTH, std=1.0),
        "spk": w("spk", len(VOICES), WIDTH, std=0.5),
        "w1": w("w1", WIDTH, WIDTH, std=1 / math.sqrt(WIDTH)), "b1": w("b1", WIDTH, std=0.1),
        "w2": w("w2", WIDTH, WIDTH, std=1 / math.sqrt(WIDTH)), "b2": w("b2", WIDTH, std=0.1),
        "wa": w("wa", WIDTH, OSCILLATORS, std=1 / math.sqrt(WIDTH)), "ba": w("ba", OSCILLATORS, std=0.1),
        "wf": w("wf", WIDTH, OSCILLATORS, std=2 / math.sqrt(WIDTH)), "bf": w("bf", OSCILLATORS, std=0.1),
        "pitch": np.array(SPEAKER_PITCH, dtype=np.float32),
        "freq_low": np.array(FREQ_LOW_HZ, dtype=np.float32),
        "freq_span": np.array(FREQ_SPAN_HZ, dtype=np.float32),
        "hop": np.array(HOP_LENGTH, dtype=np.float32),
        "radians_per_hz_sample": np.array(2 * math.pi / SAMPLE_RATE, dtype=np.float32),
        "zero_f": np.array(0.0, dtype=np.float32),
        "one_f": np.array(1.0, dtype=np.float32),
        "one_i": np.array(1, dtype=np.int64),
        "axis_1": np.array([1], dtype=np.int64),
        "axis_2": np.array([2], dtype=np.int64),
    }


def _nodes() -> list[Node]:
    return [
        # Phoneme and speaker embeddings, two tanh layers.
        Node("Gather", ["emb", "input"], ["e"]),
        Node("Gather", ["spk", "sid"], ["s"]),
        Node("Unsqueeze", ["s", "axis_1"], ["s3"]),
        Node("Add", ["e", "s3"], ["h0"]),
        Node("MatMul", ["h0", "w1"], ["m1"]), Node("Add", ["m1", "b1"], ["a1"]), Node("Tanh", ["a1"], ["h1"]),
        Node("MatMul", ["h1", "w2"], ["m2"]), Node("Add", ["m2", "b2"], ["a2"]), Node("Tanh", ["a2"], ["h2"]),
        # Per phoneme: oscillator amplitudes in (0, 1) and frequencies in Hz at the speaker's pitch.
        Node("MatMul", ["h2", "wa"], ["ma"]), Node("Add", ["ma", "ba"], ["aa"]), Node("Sigmoid", ["aa"], ["amp"]),
        Node("MatMul", ["h2", "wf"], ["mf"]), Node("Add", ["mf", "bf"], ["af"]), Node("Sigmoid", ["af"], ["fs"]),
        Node("Mul", ["fs", "freq_span"], ["fsp"]), Node("Add", ["fsp", "freq_low"], ["f0"]),
        Node("Gather", ["pitch", "sid"], ["p"]), Node("Mul", ["f0", "p"], ["freq"]),
        # Samples per phoneme: hop * length_scale (at least 1); T = ceil(N * that).
        Node("Gather", ["scales", "one_i"], ["length_scale"]),
        Node("Mul", ["length_scale", "hop"], ["hop_raw"]), Node("Max", ["hop_raw", "one_f"], ["hop_s"]),
        Node("Shape", ["input"], ["shape"]), Node("Gather", ["shape", "one_i"], ["n"]),
        Node("Cast", ["n"], ["n_f"], {"to": FLOAT}), Node("Mul", ["n_f", "hop_s"], ["t_f"]),
        Node("Ceil", ["t_f"], ["t_end"]),
        Node("Range", ["zero_f", "t_end", "one_f"], ["t"]),
        # Which phoneme each sample belongs to: the upsampling.
        Node("Div", ["t", "hop_s"], ["q"]), Node("Floor", ["q"], ["q_floor"]),
        Node("Cast", ["q_floor"], ["q_i"], {"to": INT64}), Node("Sub", ["n", "one_i"], ["last"]),
        Node("Min", ["q_i", "last"], ["at"]),
        Node("Gather", ["amp", "at"], ["amp_t"], {"axis": 1}),
        Node("Gather", ["freq", "at"], ["freq_t"], {"axis": 1}),
        # Phase integrated per sample, oscillators summed, squashed: audio [1, 1, T].
        Node("Mul", ["freq_t", "radians_per_hz_sample"], ["step"]),
        Node("CumSum", ["step", "one_i"], ["phase"]),
        Node("Sin", ["phase"], ["wave"]), Node("Mul", ["wave", "amp_t"], ["voiced"]),
        Node("ReduceSum", ["voiced", "axis_2"], ["mix"], {"keepdims": 0}),
        Node("Tanh", ["mix"], ["audio"]),
        Node("Unsqueeze", ["audio", "axis_1"], ["output"]),
    ]


def onnx_model() -> bytes:
    """The voice's ONNX model, byte-for-byte the same on every run and machine."""
    return onnx.model(
        graph_name="tiny_piper", nodes=_nodes(), initializers=_weights(), opset=OPSET, producer="skulk",
        inputs=[Value("input", INT64, [1, "phonemes"]), Value("input_lengths", INT64, [1]),
                Value("scales", FLOAT, [3]), Value("sid", INT64, [1])],
        outputs=[Value("output", FLOAT, [1, 1, "time"])],
    )


def voice_config() -> dict[str, object]:
    """The `.onnx.json` Piper reads: espeak-ng phonemes (en-us) through Piper's standard id
    map (pad '_', bos '^', eos '$', the IPA symbols), three named speakers."""
    from piper.phoneme_ids import DEFAULT_PHONEME_ID_MAP

    return {
        "dataset": "skulk-tiny-piper",
        "audio": {"sample_rate": SAMPLE_RATE, "quality": "x_low"},
        "espeak": {"voice": "en-us"},
        "language": {"code": "en_US"},
        "inference": {"noise_scale": 0.667, "length_scale": 1.0, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": {symbol: list(ids) for symbol, ids in DEFAULT_PHONEME_ID_MAP.items()},
        "num_symbols": NUM_SYMBOLS,
        "num_speakers": len(VOICES),
        "speaker_id_map": {name: index for index, name in enumerate(VOICES)},
        "hop_length": HOP_LENGTH,
        "piper_version": "1.0.0",
    }


def write_tiny_piper(out_dir: Path) -> None:
    """Write the voice (model.onnx and model.onnx.json) into `out_dir`."""
    out_dir = Path(out_dir)
    (out_dir / MODEL_FILE).write_bytes(onnx_model())
    (out_dir / CONFIG_FILE).write_text(json.dumps(voice_config(), indent=2, sort_keys=True, ensure_ascii=False),
                                       encoding="utf-8")


__all__ = ["CONFIG_FILE", "HOP_LENGTH", "MODEL_FILE", "SAMPLE_RATE", "VOICES", "onnx_model",
           "voice_config", "write_tiny_piper"]
