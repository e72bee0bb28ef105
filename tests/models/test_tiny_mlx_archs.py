"""The tiny non-Llama checkpoints of tests/tiny_mlx_archs.py: each loads with the installed
mlx-lm as its own model_type, decodes greedily the same text twice, and is written byte for
byte the same for the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

mlx_lm = pytest.importorskip("mlx_lm")

from tests.tiny_mlx_archs import MLX_MOE_TYPE, TINY_MLX_TYPES, write_tiny_mlx_model  # noqa: E402


@pytest.mark.parametrize("model_type", TINY_MLX_TYPES)
def test_loads_and_decodes_deterministically(tmp_path: Path, model_type: str) -> None:
    model_dir = write_tiny_mlx_model(tmp_path / model_type, model_type)
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == model_type

    model, tokenizer = mlx_lm.load(str(model_dir))
    assert type(model).__module__ == f"mlx_lm.models.{model_type}"
    first = mlx_lm.generate(model, tokenizer, prompt="hello", max_tokens=8)
    second = mlx_lm.generate(model, tokenizer, prompt="hello", max_tokens=8)
    assert first and first == second


@pytest.mark.parametrize("model_type", TINY_MLX_TYPES)
def test_same_seed_same_bytes(tmp_path: Path, model_type: str) -> None:
    a = write_tiny_mlx_model(tmp_path / "a", model_type)
    b = write_tiny_mlx_model(tmp_path / "b", model_type)
    c = write_tiny_mlx_model(tmp_path / "c", model_type, seed=1)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


@pytest.mark.skipif(MLX_MOE_TYPE is None, reason="no mixture-of-experts type verified")
def test_moe_checkpoint_uses_hf_per_expert_names(tmp_path: Path) -> None:
    from safetensors import safe_open

    assert MLX_MOE_TYPE is not None
    model_dir = write_tiny_mlx_model(tmp_path / "moe", MLX_MOE_TYPE)
    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
    assert not any("switch_mlp" in name for name in names)
    for e in range(config["num_experts"]):
        assert f"model.layers.0.mlp.experts.{e}.gate_proj.weight" in names
