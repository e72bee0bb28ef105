"""Spoken test audio for the speech tests: WAVs that espeak-ng speaks (a real voice, so a
Whisper hears speech), and the generated `local/tiny-whisper` and `local/tiny-mlx-whisper`
cards. Tests that need
espeak-ng skip, saying so, where it is not installed."""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import pytest

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, ShardAssignment

TINY_WHISPER = "local/tiny-whisper"
TINY_MLX_WHISPER = "local/tiny-mlx-whisper"
ESPEAK_TIMEOUT_S = 30.0
"""espeak-ng writes a sentence in well under a second; this bounds a hung one."""


def tiny_whisper_card() -> ModelCard:
    return load_card(builtin_cards_dir() / "local--tiny-whisper.toml")


RUNNER = RunnerId("runner-0")


def whisper_instance(backend: str = "faster_whisper-cpu") -> Instance:
    """A one-node instance of local/tiny-whisper on `backend`, for loading an engine by hand."""
    card = tiny_whisper_card()
    return Instance(
        instance_id=InstanceId("instance-0"), model_id=ModelId(TINY_WHISPER), sharding="Pipeline",
        shards=[ShardAssignment(node_id=NodeId("node-0"), runner_id=RUNNER, rank=0, world_size=1, start_layer=0,
                                end_layer=card.num_layers, backend=backend, slots=1)],
        context_token_limit=card.context_length,
    )


def tiny_mlx_whisper_card() -> ModelCard:
    return load_card(builtin_cards_dir() / "local--tiny-mlx-whisper.toml")


def mlx_whisper_instance(backend: str = "mlx_whisper-cpu") -> Instance:
    """A one-node instance of local/tiny-mlx-whisper on `backend`, for loading an engine by hand."""
    card = tiny_mlx_whisper_card()
    return Instance(
        instance_id=InstanceId("instance-0"), model_id=ModelId(TINY_MLX_WHISPER), sharding="Pipeline",
        shards=[ShardAssignment(node_id=NodeId("node-0"), runner_id=RUNNER, rank=0, world_size=1, start_layer=0,
                                end_layer=card.num_layers, backend=backend, slots=1)],
        context_token_limit=card.context_length,
    )


def require_espeak() -> str:
    binary = shutil.which("espeak-ng")
    if binary is None:
        pytest.skip("espeak-ng is not installed: the speech tests speak their test audio with it "
                    "(apt-get install espeak-ng)")
    return binary


def spoken_wav(text: str, out: Path, voice: str = "en") -> bytes:
    """`text` spoken by espeak-ng as a WAV file's bytes (22.05 kHz mono PCM)."""
    binary = require_espeak()
    subprocess.run([binary, "-v", voice, "-w", str(out), text], check=True, timeout=ESPEAK_TIMEOUT_S,
                   capture_output=True)
    return out.read_bytes()


def wav_duration_s(data: bytes) -> float:
    import io

    with wave.open(io.BytesIO(data)) as reader:
        return reader.getnframes() / reader.getframerate()


def silent_wav(seconds: float, rate: int = 16000) -> bytes:
    import io

    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(bytes(2 * int(rate * seconds)))
    return out.getvalue()
