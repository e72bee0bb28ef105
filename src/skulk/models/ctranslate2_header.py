"""A CTranslate2 Whisper's shape, read from its `model.bin` with a few small range reads.

A faster-whisper repository's small files (CTranslate2's config.json: alignment heads,
language token ids; the tokenizer) do not state the decoder's depth or heads; those live in
`model.bin` (hundreds of MB), a header followed by the spec's variables in name order, each
`name, rank, dims, dtype, byte count, data`. The decoder's variables come first:
`decoder/embeddings/weight` gives the vocabulary and the width within the first kilobytes;
the layers follow (`decoder/layer_0/...`), then `decoder/num_heads` (a scalar) and
`decoder/position_encodings/encodings` (the context). Layers hold the same weights, so the
k-th layer stored starts near `the second's start + (k - 1) x its bytes`: near, not at,
because CTranslate2 stores a variable equal to an earlier one (a layer norm of ones) once, as
an alias, and longer layer numbers make longer names; and the k-th stored is not layer k,
since name order puts layer_10 before layer_2. So the walk reads the first two layers'
records, counts layers by looking for a layer's first record in a read around each estimated
start (at most PROBE_WINDOW_BYTES; doubling the count, then bisecting), and finds
`decoder/num_heads` the same way after the last layer: at most MAX_READS reads, never the
weights.

Pure over the `read_at(offset, size)` callable it is given (the hub's range read, or a local
file); it never opens the network itself.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

FIRST_READ_BYTES = 1024 * 1024
"""The first read: the header and layer 0's small variables of a small model."""
READ_BYTES = 4096
"""Each later read: one variable's header (a name under 512 bytes, a few dims) and a scalar."""
PROBE_WINDOW_BYTES = 256 * 1024
"""Bytes read around an estimated layer start: room for the drift of aliased layer norms
(a few KB per layer at Whisper large's width) over every layer before it."""
MAX_READS = 128
"""Reads one walk may make: layers 0 and 1's records (~20 each, ~30 with int8 scales), ~16
probes for up to MAX_LAYERS layers, the few after them. A file that needs more is refused,
not read on."""
MAX_LAYERS = 256
"""Decoder layers the probe looks for (Whisper large has 32)."""
MIN_FORMAT_VERSION = 5
"""Oldest CTranslate2 binary version read: its variable records carry a dtype byte (3.0 on)."""

_DTYPES: dict[int, tuple[str, str | None]] = {
    0: ("f32", None), 1: ("int8", "<b"), 2: ("int16", "<h"), 3: ("int32", "<i"), 4: ("f16", None), 5: ("bf16", None),
}
"""CTranslate2's DataType codes: (the quantization a card names, the struct format of a scalar)."""


class Ct2FormatError(Exception):
    """model.bin is not a CTranslate2 Whisper this reader understands: why."""


ReadAt = Callable[[int, int], bytes]
"""`read_at(offset, size)`: up to `size` bytes of the file from `offset` (fewer at its end)."""


@dataclass(frozen=True)
class Variable:
    name: str
    dims: tuple[int, ...]
    dtype: int
    data_offset: int
    nbytes: int
    scalar: int | None
    """The value of an integer scalar, when its data was within the read."""

    @property
    def end(self) -> int:
        return self.data_offset + self.nbytes


@dataclass(frozen=True)
class WhisperShape:
    """What a card needs of a Whisper decoder."""

    vocab_size: int
    d_model: int
    decoder_layers: int
    decoder_heads: int
    text_positions: int
    quantization: str
    """The token embeddings' element type: f32, f16, bf16, int8."""


class _Reader:
    """Bounded reads over `read_at`, with the last read kept to parse from."""

    def __init__(self, read_at: ReadAt) -> None:
        self._read_at, self.reads = read_at, 0
        self._start, self._data = 0, b""

    def window(self, offset: int, need: int, size: int = READ_BYTES) -> bytes:
        """The bytes from `offset` (at least `need` of them unless the file ends; a new read
        of `size` bytes when the last one does not hold them)."""
        if not (self._start <= offset and offset + need <= self._start + len(self._data)):
            if self.reads >= MAX_READS:
                raise Ct2FormatError(f"more than {MAX_READS} reads to find the decoder's shape")
            self.reads += 1
            self._start, self._data = offset, self._read_at(offset, FIRST_READ_BYTES if self.reads == 1 else size)
        return self._data[offset - self._start:]

    def find(self, pattern: re.Pattern[bytes], around: int, half_bytes: int) -> int | None:
        """The file offset of the first match of `pattern` within `half_bytes` either side of
        `around` (at most PROBE_WINDOW_BYTES in all), or None."""
        half = max(1, min(half_bytes, PROBE_WINDOW_BYTES // 2))
        start = max(0, around - half)
        data = self.window(start, 2 * half, 2 * half)[:2 * half]
        found = pattern.search(data)
        return None if found is None else start + found.start()


def _variable(reader: _Reader, offset: int) -> Variable | None:
    """The variable whose record starts at `offset`, or None when the bytes there are not one
    (a probe past the last layer lands inside weights)."""
    data = reader.window(offset, READ_BYTES)
    try:
        (length,) = struct.unpack_from("<H", data, 0)
        raw = data[2:2 + length]
        if length < 2 or len(raw) < length or raw[-1] != 0:
            return None
        name = raw[:-1].decode("ascii")
        at = 2 + length
        (rank,) = struct.unpack_from("<B", data, at)
        if rank > 8:
            return None
        dims = struct.unpack_from(f"<{rank}I", data, at + 1)
        at += 1 + 4 * rank
        (dtype,) = struct.unpack_from("<B", data, at)
        at += 1
        (nbytes,) = struct.unpack_from("<I", data, at)
        at += 4
    except (struct.error, UnicodeDecodeError):
        return None
    if not name.isprintable() or dtype not in _DTYPES:
        return None
    scalar_format = _DTYPES[dtype][1]
    scalar = None
    if rank == 0 and scalar_format is not None and len(data) >= at + nbytes:
        (scalar,) = struct.unpack_from(scalar_format, data, at)
    return Variable(name, tuple(dims), dtype, offset + at, nbytes, scalar)


def _layer_prefix(k: int) -> str:
    return f"decoder/layer_{k}/"


def whisper_shape(read_at: ReadAt) -> WhisperShape:
    """The decoder's shape from a CTranslate2 WhisperSpec `model.bin` through `read_at`.
    Raises Ct2FormatError naming what is missing."""
    reader = _Reader(read_at)
    head = reader.window(0, 64)
    try:
        (version,) = struct.unpack_from("<I", head, 0)
        if version < MIN_FORMAT_VERSION:
            raise Ct2FormatError(f"CTranslate2 format version {version} is older than {MIN_FORMAT_VERSION} "
                                 "(CTranslate2 3.0): convert it again")
        (length,) = struct.unpack_from("<H", head, 4)
        spec = head[6:6 + length].rstrip(b"\0").decode("ascii", errors="replace")
        offset = 6 + length + 4 + 4  # spec name, spec revision, variable count
    except struct.error:
        raise Ct2FormatError("model.bin ends inside its header") from None
    if spec != "WhisperSpec":
        raise Ct2FormatError(f"model.bin holds a {spec or 'nameless'} model, not a Whisper (WhisperSpec)")

    def at(position: int) -> Variable:
        found = _variable(reader, position)
        if found is None:
            raise Ct2FormatError(f"model.bin has no variable record at byte {position}")
        return found

    embeddings: Variable | None = None
    variable = at(offset)
    while not variable.name.startswith(_layer_prefix(0)):
        if variable.name == "decoder/embeddings/weight":
            embeddings = variable
        if not variable.name.startswith("decoder/"):
            raise Ct2FormatError("model.bin has no decoder layers (decoder/layer_0)")
        variable = at(variable.end)
    if embeddings is None or len(embeddings.dims) != 2:
        raise Ct2FormatError("model.bin has no decoder token embeddings (decoder/embeddings/weight)")
    # Count stored slots, not names: slot k starts with the record slot 0 starts with, under
    # some layer's number. Slot 1's bytes measure every later slot: slot 0 (layer 0) holds the
    # originals of what later layers alias, so it may be the longer one.
    first = variable.name.removeprefix(_layer_prefix(0))
    slot_start = re.compile(rb"decoder/layer_[0-9]+/" + re.escape(first.encode()) + rb"\0")
    starts: list[int] = []
    while len(starts) < 2 and slot_start.fullmatch(variable.name.encode() + b"\0"):
        number = variable.name.split("/")[1]
        starts.append(_record_start(variable))
        while variable.name.split("/")[1:2] == [number]:
            variable = at(variable.end)
    slot_bytes = _record_start(variable) - starts[-1]

    def estimate(k: int) -> int:
        """Where slot k (or, for k = the count, what follows the layers) should start."""
        return starts[0] if k == 0 else starts[-1] + (k - len(starts) + 1) * slot_bytes

    half = slot_bytes // 2
    if len(starts) == 1:
        layers = 1
    else:
        layers = _count_layers(lambda k: reader.find(slot_start, estimate(k), half) is not None, slot_bytes)
    heads_name = reader.find(re.compile(rb"decoder/num_heads\0"), estimate(layers), half)
    if heads_name is None:
        raise Ct2FormatError("model.bin states no decoder head count (decoder/num_heads)")
    variable = at(heads_name - 2)  # the name's length field
    heads = positions = None
    while variable.name.startswith("decoder/") and (heads is None or positions is None):
        if variable.name == "decoder/num_heads":
            heads = variable.scalar
        elif variable.name == "decoder/position_encodings/encodings" and len(variable.dims) == 2:
            positions = variable.dims[0]
        variable = at(variable.end)
    if heads is None or heads <= 0 or embeddings.dims[1] % heads:
        raise Ct2FormatError("model.bin states no usable decoder head count (decoder/num_heads)")
    if positions is None:
        raise Ct2FormatError("model.bin has no decoder position encodings (decoder/position_encodings)")
    vocab, width = embeddings.dims
    return WhisperShape(vocab_size=vocab, d_model=width, decoder_layers=layers, decoder_heads=heads,
                        text_positions=positions, quantization=_DTYPES[embeddings.dtype][0])


def _record_start(variable: Variable) -> int:
    """Where `variable`'s record begins (its name's length field): name length, name and its
    NUL, rank, dims, dtype, byte count."""
    return variable.data_offset - (2 + len(variable.name) + 1 + 1 + 4 * len(variable.dims) + 1 + 4)


def _count_layers(opens: Callable[[int], bool], layer_bytes: int) -> int:
    """Decoder layers: the largest k for which `opens(k)` (a layer's first record is where
    the k-th stored layer would start), plus one. Slots 0 and 1 are known to exist."""
    if layer_bytes <= 0:
        raise Ct2FormatError("model.bin's decoder layer 0 is empty")

    low, high = 1, 2  # slot `low` exists; look for one that does not
    while high < MAX_LAYERS and opens(high):
        low, high = high, high * 2
    if high >= MAX_LAYERS and opens(min(high, MAX_LAYERS)):
        raise Ct2FormatError(f"more than {MAX_LAYERS} decoder layers")
    while high - low > 1:
        middle = (low + high) // 2
        if opens(middle):
            low = middle
        else:
            high = middle
    return low + 1


__all__ = ["Ct2FormatError", "ReadAt", "WhisperShape", "whisper_shape"]
