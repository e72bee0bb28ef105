"""Parameter counts of a safetensors model from its files' headers, without reading weights.

A safetensors file opens with an 8-byte little-endian length and that many bytes of JSON:
each tensor's dtype, shape and offsets. The card builder counts parameters from it the way
it does from a GGUF's tensor table. MLX-quantized layers store their weight packed into
uint32 words next to `scales` and `biases`; a packed weight holds 32 / bits parameters per
stored element, and its scales and biases are quantization overhead, not parameters.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skulk.models.card_builder import CardBuildError

SAFETENSORS_HEADER_LIMIT_BYTES = 100 * 1024 * 1024
"""The format's own cap on a header (safetensors refuses larger ones)."""
FIRST_READ_BYTES = 256 * 1024
"""One read covers most headers (a shard's is tens of KB); a larger one is read again at
its stated size."""
MAX_HUB_WEIGHT_FILES = 64
"""Most weight files whose headers a hub card reads (two small Range requests at most
each); a checkpoint in more files gets no parameter count, as a split GGUF gets none."""
PACKED_DTYPE = "U32"
"""MLX packs quantized weights into uint32 words."""
PACKED_WORD_BITS = 32


@dataclass(frozen=True)
class StoredTensor:
    dtype: str
    shape: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def parse_safetensors_header(data: bytes, source: str) -> dict[str, StoredTensor]:
    """The tensors a safetensors file's first bytes describe (`data` holds the whole header)."""
    if len(data) < 8:
        raise CardBuildError(source, "not a safetensors file (shorter than its length field)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > SAFETENSORS_HEADER_LIMIT_BYTES:
        raise CardBuildError(source, f"safetensors header of {size} bytes is over the format's limit")
    if len(data) < 8 + size:
        raise CardBuildError(source, "the safetensors file ends inside its header")
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as exc:
        raise CardBuildError(source, f"the safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CardBuildError(source, "the safetensors header is not a JSON object")
    tensors: dict[str, StoredTensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise CardBuildError(source, f"tensor {name!r} has no valid dtype and shape")
        tensors[name] = StoredTensor(dtype, tuple(shape))
    return tensors


def read_safetensors_header(read: Callable[[int], bytes], source: str) -> dict[str, StoredTensor]:
    """The header through `read(n)` (the first n bytes of the file): one read, or two when
    the header is larger than the first."""
    data = read(FIRST_READ_BYTES)
    if len(data) >= 8:
        (size,) = struct.unpack("<Q", data[:8])
        if size <= SAFETENSORS_HEADER_LIMIT_BYTES and len(data) < 8 + size:
            data = read(8 + size)
    return parse_safetensors_header(data, source)


def _bits(module: str, quantization: Mapping[str, Any]) -> int | None:
    """A quantized module's bits: its own entry in the config's quantization table, else the
    table's default."""
    own = quantization.get(module)
    if isinstance(own, Mapping) and isinstance(own.get("bits"), int):
        return own["bits"]
    bits = quantization.get("bits")
    return bits if isinstance(bits, int) else None


def parameter_elements(tensors: Mapping[str, StoredTensor], quantization: Mapping[str, Any] | None) -> dict[str, int]:
    """Parameters per tensor: a packed quantized weight unpacked by its bits; the scales and
    biases that quantize it left out."""
    quant = quantization or {}
    counts: dict[str, int] = {}
    for name, tensor in tensors.items():
        module, _, leaf = name.rpartition(".")
        quantized = f"{module}.scales" in tensors
        if quantized and leaf in ("scales", "biases"):
            continue
        bits = _bits(module, quant) if quantized and leaf == "weight" and tensor.dtype == PACKED_DTYPE else None
        counts[name] = tensor.elements * PACKED_WORD_BITS // bits if bits else tensor.elements
    return counts


def model_parameter_elements(weight_files: Sequence[str], prefix_reader: Callable[[str], Callable[[int], bytes]],
                            config: Mapping[str, Any]) -> dict[str, int]:
    """Parameters per tensor over every weight file of a model (tensor names are unique
    across a sharded checkpoint's files); `prefix_reader(file)` reads a file's first bytes."""
    quantization = config.get("quantization") or config.get("quantization_config")
    counts: dict[str, int] = {}
    for file in weight_files:
        tensors = read_safetensors_header(prefix_reader(file), file)
        counts.update(parameter_elements(tensors, quantization if isinstance(quantization, Mapping) else None))
    return counts


__all__ = [
    "MAX_HUB_WEIGHT_FILES",
    "SAFETENSORS_HEADER_LIMIT_BYTES",
    "StoredTensor",
    "model_parameter_elements",
    "parameter_elements",
    "parse_safetensors_header",
    "read_safetensors_header",
]
