"""A CTranslate2 Whisper's decoder shape from model.bin's variable records, on real
CTranslate2 output (the tiny Whisper's spec, saved by CTranslate2 itself) of several depths,
widths and element types, read with small windows so that the layer probe does the work."""

from __future__ import annotations

import pytest

from skulk.models import ctranslate2_header, tiny_whisper
from skulk.models.ctranslate2_header import Ct2FormatError, whisper_shape

pytest.importorskip("ctranslate2")


def _model_bin(tmp_path, monkeypatch, layers: int, heads: int, quantization: str | None) -> bytes:
    monkeypatch.setattr(tiny_whisper, "DECODER_LAYERS", layers)
    monkeypatch.setattr(tiny_whisper, "HEADS", heads)
    tokens = tiny_whisper.vocabulary()
    spec = tiny_whisper.build_spec(len(tokens), tokens.index("<|endoftext|>"))
    spec.register_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(tmp_path))
    return (tmp_path / "model.bin").read_bytes()


@pytest.mark.parametrize(("layers", "heads", "quantization", "expected_type"), [
    (1, 2, None, "f32"),
    (2, 2, None, "f32"),
    (5, 4, "float16", "f16"),
    (12, 1, None, "f32"),      # past layer 9 the names grow a digit: the probe allows for the drift
    (33, 2, "int8", "int8"),   # weight scales beside every int8 matrix
])
def test_the_decoders_shape_is_read_without_the_weights(tmp_path, monkeypatch, layers, heads, quantization,
                                                        expected_type):
    data = _model_bin(tmp_path, monkeypatch, layers, heads, quantization)
    monkeypatch.setattr(ctranslate2_header, "FIRST_READ_BYTES", 4096)
    monkeypatch.setattr(ctranslate2_header, "PROBE_WINDOW_BYTES", 16384)
    reads: list[tuple[int, int]] = []

    def read_at(offset: int, size: int) -> bytes:
        reads.append((offset, size))
        return data[offset:offset + size]

    shape = whisper_shape(read_at)
    assert (shape.decoder_layers, shape.decoder_heads, shape.d_model, shape.vocab_size, shape.text_positions) == (
        layers, heads, tiny_whisper.D_MODEL, len(tiny_whisper.vocabulary()), tiny_whisper.TEXT_POSITIONS)
    assert shape.quantization == expected_type
    assert len(reads) <= ctranslate2_header.MAX_READS
    assert sum(size for _, size in reads) < len(data) // 2  # the weights are skipped, not read


@pytest.mark.parametrize(("data", "says"), [
    (b"\0" * 64, "format version 0"),
    (b"\x06\0\0\0" + b"\x0a\0TransSpec\0" + b"\0" * 40, "a TransSpec model, not a Whisper"),
    (b"\x06\0\0\0", "ends inside its header"),
])
def test_what_is_not_a_whisper_is_refused_by_name(data, says):
    with pytest.raises(Ct2FormatError, match=says):
        whisper_shape(lambda offset, size: data[offset:offset + size])
