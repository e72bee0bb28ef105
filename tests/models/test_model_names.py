"""The names users type: Ollama library names through the one data table, Hugging Face repos
with or without a quant, Ollama's hf.co spelling, card ids as they are."""

from __future__ import annotations

import pytest

from skulk.models.model_names import (
    UnknownModelName,
    load_library,
    parse_library,
    resolve_model_name,
)

LIBRARY = load_library()
CARDS = {"local/tiny-llama-gguf", "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"}


@pytest.mark.parametrize(("typed", "expected"), [
    ("llama3.2:1b", ("bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", "ollama")),
    ("llama3.2", ("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M", "ollama")),
    ("llama3.2:latest", ("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M", "ollama")),
    ("Llama3.2:1B", ("bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", "ollama")),
    ("llama3.2:1b-instruct-q8_0", ("bartowski/Llama-3.2-1B-Instruct-GGUF", "Q8_0", "ollama")),
    ("qwen3:30b-a3b", ("unsloth/Qwen3-30B-A3B-GGUF", "Q4_K_M", "ollama")),
    ("gemma3:4b", ("unsloth/gemma-3-4b-it-GGUF", "Q4_K_M", "ollama")),
    ("unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M", ("unsloth/Qwen3-30B-A3B-GGUF", "Q4_K_M", "repo")),
    ("unsloth/Qwen3-30B-A3B-GGUF:q8_0", ("unsloth/Qwen3-30B-A3B-GGUF", "Q8_0", "repo")),
    ("hf.co/unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M", ("unsloth/Qwen3-30B-A3B-GGUF", "Q4_K_M", "repo")),
    ("unsloth/Qwen3-30B-A3B-GGUF", ("unsloth/Qwen3-30B-A3B-GGUF", None, "repo")),
    ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", None, "card")),
    (" local/tiny-llama-gguf ", ("local/tiny-llama-gguf", None, "card")),
])
def test_resolve(typed, expected):
    resolved = resolve_model_name(typed, CARDS, LIBRARY)
    assert (resolved.model_id, resolved.quant, resolved.via) == expected


@pytest.mark.parametrize(("typed", "says"), [
    ("llama3.2:70b", "Known here: llama3.2:1b, llama3.2:3b"),
    ("lama3.2:1b", "llama3.2:1b"),
    ("nothing-like-it", "Name a Hugging Face GGUF repo"),
    ("bad//repo", "is not a Hugging Face repo id"),
])
def test_unknown_names_say_what_is_known(typed, says):
    with pytest.raises(UnknownModelName, match=says):
        resolve_model_name(typed, CARDS, LIBRARY)


def test_every_library_entry_is_a_repo_and_quant_and_every_latest_names_one():
    assert len(LIBRARY.names) >= 20 and all(f"{n}:{t}" in LIBRARY.names for n, t in LIBRARY.latest.items())


@pytest.mark.parametrize(("text", "says"), [
    ('[names]\n"x:1b" = "not-a-repo"\n', "is not 'name:tag'"),
    ('[names]\n"x" = "a/b:Q4_K_M"\n', "is not 'name:tag'"),
    ('[names]\n"x:1b" = "a/b:Q4_K_M"\n[latest]\n"x" = "2b"\n', "names no entry x:2b"),
])
def test_a_malformed_table_is_refused_by_entry(text, says):
    with pytest.raises(ValueError, match=says):
        parse_library(text)


@pytest.mark.parametrize(("typed", "placed", "expected"), [
    ("llama3.2:1b", {"bartowski/Llama-3.2-1B-Instruct-GGUF"}, "bartowski/Llama-3.2-1B-Instruct-GGUF"),
    ("llama3.2:1b", set(), "llama3.2:1b"),  # not placed: the 404 names what was typed
    ("local/tiny-llama-gguf", {"local/tiny-llama-gguf"}, "local/tiny-llama-gguf"),
    ("no-such:thing", {"a/b"}, "no-such:thing"),
    ("hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M", {"unsloth/Qwen3-8B-GGUF"}, "unsloth/Qwen3-8B-GGUF"),
])
def test_placed_model_id(typed, placed, expected):
    from skulk.models.model_names import placed_model_id

    assert placed_model_id(typed, placed, CARDS, LIBRARY) == expected
