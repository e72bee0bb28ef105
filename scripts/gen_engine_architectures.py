"""Regenerate src/skulk/shared/types/engine_architectures.py from the engines this project pins.

The architectures Skulk accepts are a fact of the engines, not a list of ours:
- llama.cpp: the names in `LLM_ARCH_NAMES` of `src/llama-arch.cpp`, read from the
  llama-cpp-python sdist that uv.lock pins (the same source the in-process engine's wheel and
  the managed llama-server build come from);
- mlx-lm: every `mlx_lm.models.<type>` module that defines `Model` and `ModelArgs`, plus
  mlx-lm's own `MODEL_REMAPPING` aliases, read from the installed package; and the types
  whose attention caches multi-head latent attention's compressed latent (the module hands
  `kv_latent` to `cache.update_and_fetch`) rather than per-head keys and values, which sizes
  their KV cache (`skulk.shared.kv_shape`).

Run after bumping llama-cpp-python or mlx-lm (tests/shared/test_engine_architectures.py
fails until then):

    uv run python scripts/gen_engine_architectures.py [path/to/llama_cpp_python-<v>.tar.gz]

Without a path the sdist is taken from the managed-build cache (`skulk engines install`
downloads and verifies it there) or downloaded from the url uv.lock pins and checked
against the lock's sha256.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "skulk" / "shared" / "types" / "engine_architectures.py"
NOT_MODELS = {"clip", "(unknown)"}
"""LLM_ARCH_NAMES entries that name no loadable model (clip is llama-quantize's dummy)."""


def _llama_sdist(version: str) -> Path:
    from skulk.provision.llama_build import sdist_pin_from_lock

    cached = Path.home() / ".cache" / "skulk" / "engines" / "sdist" / f"llama_cpp_python-{version}.tar.gz"
    if cached.is_file():
        return cached
    pin = sdist_pin_from_lock((ROOT / "uv.lock").read_text(), "llama-cpp-python", version)
    if pin is None:
        sys.exit(f"uv.lock pins no llama-cpp-python {version} sdist")
    data = urllib.request.urlopen(pin.url, timeout=120).read()
    if hashlib.sha256(data).hexdigest() != pin.sha256:
        sys.exit(f"{pin.url}: sha256 differs from uv.lock")
    target = Path("/tmp") / pin.filename
    target.write_bytes(data)
    return target


def llama_architectures(sdist: Path) -> list[str]:
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("vendor/llama.cpp/src/llama-arch.cpp"))
        handle = tar.extractfile(member)
        assert handle is not None
        text = handle.read().decode()
    block = re.search(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", text, re.S)
    if block is None:
        sys.exit("llama-arch.cpp has no LLM_ARCH_NAMES table")
    names = re.findall(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}', block.group(1))
    return sorted(set(names) - NOT_MODELS)


def mlx_model_types() -> tuple[list[str], dict[str, str]]:
    import mlx_lm.models
    import mlx_lm.utils

    types = []
    for info in pkgutil.iter_modules(mlx_lm.models.__path__):
        try:
            module = importlib.import_module(f"mlx_lm.models.{info.name}")
        except (ImportError, SystemExit):  # needs a package we do not ship (olmo: ai2-olmo)
            continue
        if hasattr(module, "Model") and hasattr(module, "ModelArgs"):
            types.append(info.name)
    remap = {k: v for k, v in mlx_lm.utils.MODEL_REMAPPING.items() if v in types}
    return sorted(types), dict(sorted(remap.items()))


CACHE_CALL = re.compile(r"\.update_and_fetch\(\s*(\w+)")
"""A cache write and its first argument: `cache.update_and_fetch(kv_latent, k_pe)` is how an
mlx-lm attention caches the MLA latent."""
SIBLING_IMPORT = re.compile(r"^from \.(\w+) import", re.M)


def _sources(model_type: str, types: list[str]) -> list[str]:
    """The source of a model module and of the sibling model modules it imports from
    (kimi_vl's language model is deepseek_v3's), transitively; mlx-lm's shared modules
    (cache, base, ...) are framework, not a model's attention."""
    seen: dict[str, str] = {}
    pending = [model_type]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        try:
            seen[name] = inspect.getsource(importlib.import_module(f"mlx_lm.models.{name}"))
        except (ImportError, SystemExit):
            seen[name] = ""
        pending.extend(n for n in SIBLING_IMPORT.findall(seen[name]) if n in types)
    return list(seen.values())


def mlx_latent_kv_types(types: list[str]) -> list[str]:
    """The model types whose attention caches only the MLA latent (one head of kv_lora_rank
    keys and qk_rope_head_dim values per token): every cache write in their code writes
    `kv_latent`. A type that also caches something else per token (deepseek_v32's indexer
    keys) is left out, so it is costed high rather than low."""
    latent = []
    for model_type in types:
        writes = [arg for source in _sources(model_type, types) for arg in CACHE_CALL.findall(source)]
        if writes and all(arg == "kv_latent" for arg in writes):
            latent.append(model_type)
    return sorted(latent)


def render(llama_version: str, llama: list[str], mlx_version: str, mlx: list[str], remap: dict[str, str],
           latent: list[str]) -> str:
    def words(names: list[str]) -> str:
        lines, line = [], "    "
        for name in names:
            item = f'"{name}", '
            if len(line) + len(item) > 110:
                lines.append(line.rstrip())
                line = "    "
            line += item
        lines.append(line.rstrip())
        return "\n".join(lines)

    remap_lines = "\n".join(f'    "{k}": "{v}",' for k, v in remap.items())
    return f'''"""Which architectures the engines we ship can load: generated, never edited by hand.

Written by scripts/gen_engine_architectures.py from llama-cpp-python {llama_version}'s vendored
llama.cpp (`LLM_ARCH_NAMES`) and mlx-lm {mlx_version}'s model modules. A model card is built only
for an architecture listed here (`skulk.models.card_builder`); sharding across nodes is a
separate, per-engine question (`skulk.shared.types.engines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

LLAMA_CPP_VERSION = "{llama_version}"
"""The llama-cpp-python release whose llama.cpp the table was read from."""

LLAMA_CPP_ARCHITECTURES: frozenset[str] = frozenset({{
{words(llama)}
}})
"""GGUF `general.architecture` values that llama.cpp loads."""

MLX_LM_VERSION = "{mlx_version}"
"""The mlx-lm release whose model modules the table was read from."""

MLX_MODEL_TYPES: frozenset[str] = frozenset({{
{words(mlx)}
}})
"""config.json `model_type` values mlx-lm has a model class for."""

MLX_MODEL_REMAPPING: Mapping[str, str] = MappingProxyType({{
{remap_lines}
}})
"""mlx-lm's aliases: a config's `model_type` that loads through another type's class."""

MLX_LATENT_KV_TYPES: frozenset[str] = frozenset({{
{words(latent)}
}})
"""Types whose mlx-lm attention caches the MLA latent (`kv_lora_rank` keys and
`qk_rope_head_dim` values, one head) rather than per-head keys and values."""

__all__ = ["LLAMA_CPP_ARCHITECTURES", "LLAMA_CPP_VERSION", "MLX_LATENT_KV_TYPES", "MLX_LM_VERSION",
           "MLX_MODEL_REMAPPING", "MLX_MODEL_TYPES"]
'''


def main() -> None:
    import llama_cpp
    import mlx_lm

    sdist = Path(sys.argv[1]) if len(sys.argv) > 1 else _llama_sdist(llama_cpp.__version__)
    mlx, remap = mlx_model_types()
    OUT.write_text(render(llama_cpp.__version__, llama_architectures(sdist), mlx_lm.__version__, mlx, remap,
                          mlx_latent_kv_types(mlx)))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
