"""The tiny models of other architectures (tests/tiny_archs.py): each loads in the installed
llama-cpp-python and decodes the same greedy text every time; files are byte-identical for a
seed and carry the metadata a model card is built from."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from skulk.models.tiny_models import CHAT_TEMPLATE, TINY_SPEC
from tests.tiny_archs import EXPERTS, EXPERTS_USED, MOE_ARCH, TINY_ARCHS, write_tiny_arch_gguf

REQUIRED = ("qwen3moe", "olmo2", "granite", "phi2", "smollm3", "starcoder2")


def _fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}


def test_the_required_architectures_are_available() -> None:
    assert set(REQUIRED) <= set(TINY_ARCHS)
    assert MOE_ARCH in TINY_ARCHS


def test_an_unknown_architecture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tiny writer"):
        write_tiny_arch_gguf(tmp_path / "x.gguf", "llama")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_llama_cpp_generates_the_same_text_twice(tmp_path: Path, arch: str) -> None:
    from llama_cpp import Llama

    path = write_tiny_arch_gguf(tmp_path / f"{arch}.gguf", arch)
    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False)
    try:
        texts = [llm.create_completion("hello", max_tokens=8, temperature=0)["choices"][0]["text"] for _ in range(2)]
    finally:
        llm.close()
    assert texts[0].strip(), f"{arch}: empty completion {texts[0]!r}"
    assert texts[0] == texts[1]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_metadata_for_a_model_card(tmp_path: Path, arch: str) -> None:
    fields = _fields(write_tiny_arch_gguf(tmp_path / f"{arch}.gguf", arch))
    assert fields["general.architecture"] == arch
    assert fields["general.name"]
    assert fields["general.file_type"] == gguf.LlamaFileType.ALL_F32
    for key in ("attention.head_count", "embedding_length", "block_count", "context_length"):
        assert isinstance(fields[f"{arch}.{key}"], int), key
    assert len(fields["tokenizer.ggml.tokens"]) == TINY_SPEC.vocab_size
    assert fields["tokenizer.chat_template"] == CHAT_TEMPLATE


def test_moe_metadata(tmp_path: Path) -> None:
    fields = _fields(write_tiny_arch_gguf(tmp_path / "moe.gguf", MOE_ARCH))
    assert fields[f"{MOE_ARCH}.expert_count"] == EXPERTS == 4
    assert fields[f"{MOE_ARCH}.expert_used_count"] == EXPERTS_USED == 2


def test_files_are_deterministic_per_seed(tmp_path: Path) -> None:
    first = write_tiny_arch_gguf(tmp_path / "a.gguf", MOE_ARCH).read_bytes()
    assert write_tiny_arch_gguf(tmp_path / "b.gguf", MOE_ARCH).read_bytes() == first
    assert write_tiny_arch_gguf(tmp_path / "c.gguf", MOE_ARCH, seed=1).read_bytes() != first
