"""Parameter counts from safetensors headers: the pure parse and count over synthetic
headers, and the count over real checkpoints (a tiny MLX MoE, plain and quantized by
mlx-lm itself) against the parameters mlx-lm's own model holds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from skulk.models.card_builder import CardBuildError, card_from_config
from skulk.models.safetensors_header import (
    SAFETENSORS_HEADER_LIMIT_BYTES,
    StoredTensor,
    model_parameter_elements,
    parameter_elements,
    parse_safetensors_header,
    read_safetensors_header,
)


def _file(header: dict) -> bytes:
    body = json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body


def _entry(dtype: str, shape: list[int]) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}


def _prefix_reader(data: bytes, reads: list[int] | None = None):
    def read(size: int) -> bytes:
        if reads is not None:
            reads.append(size)
        return data[:size]
    return read


@pytest.mark.parametrize(("tensors", "quantization", "expected"), [
    # Plain weights count their elements; metadata is not a tensor.
    ({"a.weight": StoredTensor("F16", (4, 8)), "a.bias": StoredTensor("F16", (4,))}, None,
     {"a.weight": 32, "a.bias": 4}),
    # A 4-bit packed weight holds 8 parameters per uint32; its scales and biases are overhead.
    ({"q.weight": StoredTensor("U32", (4, 2)), "q.scales": StoredTensor("F16", (4, 1)),
      "q.biases": StoredTensor("F16", (4, 1))}, {"bits": 4, "group_size": 16}, {"q.weight": 64}),
    # A module's own entry in the quantization table wins over the default bits.
    ({"gate.weight": StoredTensor("U32", (4, 4)), "gate.scales": StoredTensor("F16", (4, 1)),
      "gate.biases": StoredTensor("F16", (4, 1))}, {"bits": 4, "gate": {"bits": 8, "group_size": 16}},
     {"gate.weight": 64}),
    # An unquantized weight beside quantized ones is counted as stored.
    ({"norm.weight": StoredTensor("F16", (16,)), "q.weight": StoredTensor("U32", (2, 2)),
      "q.scales": StoredTensor("F16", (2, 1))}, {"bits": 2}, {"norm.weight": 16, "q.weight": 64}),
])
def test_parameters_per_tensor(tensors, quantization, expected):
    assert parameter_elements(tensors, quantization) == expected


@pytest.mark.parametrize(("data", "message"), [
    (b"\x01\x00", "shorter than its length field"),
    (struct.pack("<Q", 50) + b"{}", "ends inside its header"),
    (struct.pack("<Q", SAFETENSORS_HEADER_LIMIT_BYTES + 1), "over the format's limit"),
    (struct.pack("<Q", 3) + b"{x}", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (_file({"t": {"dtype": "F16", "shape": [-1]}}), "no valid dtype and shape"),
    (_file({"t": {"shape": [2]}}), "no valid dtype and shape"),
])
def test_a_malformed_header_is_refused_by_reason(data, message):
    with pytest.raises(CardBuildError, match=message):
        parse_safetensors_header(data, "m.safetensors")


def test_a_header_larger_than_the_first_read_is_read_again_at_its_size():
    data = _file({"__metadata__": {"pad": "x" * (2 * 1024 * 1024)}, "w": _entry("BF16", [3, 5])})
    reads: list[int] = []
    assert read_safetensors_header(_prefix_reader(data, reads), "big") == {"w": StoredTensor("BF16", (3, 5))}
    assert reads == [256 * 1024, len(data)]


def test_a_sharded_checkpoint_counts_every_file():
    files = {"model-00001-of-00002.safetensors": _file({"a": _entry("F16", [2, 3])}),
             "model-00002-of-00002.safetensors": _file({"b": _entry("F16", [4])})}
    counts = model_parameter_elements(sorted(files), lambda name: _prefix_reader(files[name]), {})
    assert counts == {"a": 6, "b": 4}


def test_an_mlx_moe_card_counts_total_and_active_parameters():
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
              "vocab_size": 10, "max_position_embeddings": 64, "num_experts": 4, "num_experts_per_tok": 1}
    elements = {"model.embed_tokens.weight": 80, "model.layers.0.mlp.gate.weight": 32,
                "model.layers.0.mlp.switch_mlp.up_proj.weight": 400,
                "model.layers.0.mlp.shared_experts.up_proj.weight": 100}
    card = card_from_config("org/m", config, 1000, tensor_elements=elements)
    assert card.total_parameters == 612
    assert card.active_parameters == 612 - 400 + 100


@pytest.mark.parametrize("quantized", [False, True])
def test_a_real_mlx_checkpoint_counts_what_mlx_lm_loads(tmp_path: Path, quantized: bool):
    mlx_lm = pytest.importorskip("mlx_lm")
    from mlx.utils import tree_flatten

    from tests.tiny_mlx_archs import MLX_MOE_TYPE, write_tiny_mlx_model

    model_dir = write_tiny_mlx_model(tmp_path / "src", MLX_MOE_TYPE or "olmo2")
    model, _ = mlx_lm.load(str(model_dir))
    loaded = sum(array.size for _, array in tree_flatten(model.parameters()))
    if quantized:
        mlx_lm.convert(str(model_dir), mlx_path=str(tmp_path / "q4"), quantize=True, q_bits=4, q_group_size=32)
        model_dir = tmp_path / "q4"
    config = json.loads((model_dir / "config.json").read_text())
    assert ("quantization" in config) == quantized
    weights = sorted(p.name for p in model_dir.iterdir() if p.name.endswith(".safetensors"))
    counts = model_parameter_elements(weights, lambda name: _prefix_reader((model_dir / name).read_bytes()), config)
    assert sum(counts.values()) == loaded
