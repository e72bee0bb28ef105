"""The project's generated speech models: which `local/` speech card is written by which
generator, into which directory, and what an engine loads from it.

Like `local/tiny-llama-gguf`, each is a real model of its family (a Whisper converted to
CTranslate2 or to mlx-whisper's layout, a Piper voice exported to ONNX) with small random weights, written offline on
first use, so that tests and a fresh node serve speech with no hub. The generic machinery
(lock, partial directory, marker, regeneration on a version change) is
`skulk.models.tiny_models.ensure_generated`; this table only says what to write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class GeneratedSpeechModel:
    """`dir_name`: its directory under the models dir. `version`: bumped whenever the
    generator's output changes (a stale directory is regenerated). `write(out_dir)`: writes
    the model's files into an empty directory, deterministically. `entry`: the path an
    engine loads, relative to the directory ('' = the directory itself)."""

    dir_name: str
    version: str
    write: Callable[[Path], None]
    entry: str = ""


def _write_tiny_whisper(out_dir: Path) -> None:
    from skulk.models.tiny_whisper import write_tiny_whisper

    write_tiny_whisper(out_dir)


def _write_tiny_mlx_whisper(out_dir: Path) -> None:
    from skulk.models.tiny_mlx_whisper import write_tiny_mlx_whisper

    write_tiny_mlx_whisper(out_dir)


def _write_tiny_piper(out_dir: Path) -> None:
    from skulk.models.tiny_piper import write_tiny_piper

    write_tiny_piper(out_dir)


SPEECH_GENERATORS: Mapping[str, GeneratedSpeechModel] = MappingProxyType({
    # One entry per generated speech card, each writer importing its generator lazily.
    "local/tiny-whisper": GeneratedSpeechModel(dir_name="tiny-whisper", version="tiny-whisper-1",
                                               write=_write_tiny_whisper),
    # The same kind of model in mlx-whisper's layout (config.json + weights.safetensors);
    # bump the version with skulk.models.tiny_mlx_whisper.
    "local/tiny-mlx-whisper": GeneratedSpeechModel(dir_name="tiny-mlx-whisper", version="tiny-mlx-whisper-1",
                                                   write=_write_tiny_mlx_whisper),
    # A Piper voice (model.onnx + model.onnx.json); bump the version with skulk.models.tiny_piper.
    "local/tiny-piper": GeneratedSpeechModel(dir_name="tiny-piper", version="tiny-piper-1",
                                             write=_write_tiny_piper, entry="model.onnx"),
})
"""Generated speech cards by model id."""


__all__ = ["SPEECH_GENERATORS", "GeneratedSpeechModel"]
