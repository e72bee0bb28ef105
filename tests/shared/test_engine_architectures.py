"""The architecture tables are the engines' own facts: generated from the pinned engines,
checked here against what is installed, so a bump that is not regenerated fails."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from skulk.shared.types.engine_architectures import (
    LLAMA_CPP_ARCHITECTURES,
    LLAMA_CPP_VERSION,
    MLX_LATENT_KV_TYPES,
    MLX_LM_VERSION,
    MLX_MODEL_REMAPPING,
    MLX_MODEL_TYPES,
)

REGENERATE = "run: uv run python scripts/gen_engine_architectures.py"


def test_the_tables_come_from_the_installed_engines():
    assert importlib.metadata.version("llama-cpp-python") == LLAMA_CPP_VERSION, REGENERATE
    assert importlib.metadata.version("mlx-lm") == MLX_LM_VERSION, REGENERATE


def test_every_llama_cpp_architecture_is_a_name_the_shipped_library_holds():
    """The in-process engine's own libllama carries each name (its LLM_ARCH_NAMES strings)."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    library = next(iter(sorted(lib.glob("libllama.*")) + sorted(lib.glob("llama.*"))), None)
    if library is None:
        pytest.skip(f"no libllama under {lib}")
    data = library.read_bytes()
    # NUL-terminated, and maybe the tail of a longer string ("qwen2" ends "rwkv6qwen2"): the
    # linker merges string suffixes.
    missing = sorted(name for name in LLAMA_CPP_ARCHITECTURES if name.encode() + b"\0" not in data)
    assert not missing, f"{library.name} does not name {missing}: {REGENERATE}"
    assert {"llama", "qwen3moe", "gpt-oss", "gemma3n", "olmo2", "granite", "phi2"} <= LLAMA_CPP_ARCHITECTURES


def test_the_mlx_table_is_what_the_installed_mlx_lm_loads():
    pytest.importorskip("mlx_lm")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        from gen_engine_architectures import mlx_latent_kv_types, mlx_model_types
    finally:
        sys.path.pop(0)
    types, remap = mlx_model_types()
    assert (frozenset(types), dict(remap)) == (MLX_MODEL_TYPES, dict(MLX_MODEL_REMAPPING)), REGENERATE
    assert frozenset(mlx_latent_kv_types(types)) == MLX_LATENT_KV_TYPES, REGENERATE
