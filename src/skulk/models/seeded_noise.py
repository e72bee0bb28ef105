"""Primitives every generated tiny model is made of: platform-stable seeded noise for its
weights and GPT-2's byte-level alphabet for its tokenizers. A module of their own so each
generator (`tiny_models`, `tiny_whisper`, `tiny_piper`, ...) imports them without importing
the others (the generated models' table imports every generator)."""

from __future__ import annotations

import math
import zlib

import numpy as np


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte maps to one printable character. Both
    `tokenizers`' ByteLevel and llama.cpp's 'gpt2' vocab type spell tokens in it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def uniform(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    """float32 uniform noise of standard deviation `std`, from a PCG64 stream keyed by
    (seed, tensor name). Raw 64-bit outputs -> top 24 bits -> [-1, 1) is exact integer
    and power-of-two arithmetic, so the bytes do not depend on the platform or numpy's
    sampler implementations."""
    count = math.prod(shape)
    stream = np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
    top_bits = (stream.random_raw(count) >> np.uint64(40)).astype(np.float32)
    unit = top_bits * np.float32(2.0**-23) - np.float32(1.0)
    # Uniform on [-a, a) has standard deviation a / sqrt(3).
    return (unit * np.float32(std * math.sqrt(3.0))).reshape(shape)


__all__ = ["bytes_to_unicode", "uniform"]
