"""Which repository files make up a card's artifact: table-driven tests of the pure rules."""

from __future__ import annotations

import pytest

from skulk.models.hub_files import (
    RepoFile,
    SelectionError,
    choose_gguf_file,
    gguf_candidates,
    is_gguf_repo,
    quant_of,
    select_files,
    shard_group,
    shard_info,
    total_size_bytes,
)

MLX_REPO = [
    RepoFile("config.json", 700),
    RepoFile("tokenizer.json", 9000),
    RepoFile("tokenizer_config.json", 300),
    RepoFile("special_tokens_map.json", 100),
    RepoFile("generation_config.json", 90),
    RepoFile("model-00001-of-00002.safetensors", 5_000),
    RepoFile("model-00002-of-00002.safetensors", 4_000),
    RepoFile("model.safetensors.index.json", 800),
    RepoFile("README.md", 2000),
    RepoFile(".gitattributes", 1500),
    RepoFile("original/consolidated.safetensors", 9_000),
    RepoFile("pytorch_model.bin", 9_000),
]

GGUF_REPO = [
    RepoFile("Model-Q2_K.gguf", 1),
    RepoFile("Model-Q4_K_M.gguf", 2),
    RepoFile("Model-Q8_0.gguf", 3),
    RepoFile("Model-F16-00001-of-00003.gguf", 4),
    RepoFile("Model-F16-00002-of-00003.gguf", 4),
    RepoFile("Model-F16-00003-of-00003.gguf", 4),
    RepoFile("mmproj-Model-f16.gguf", 5),
    RepoFile("README.md", 6),
]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("m-00001-of-00003.gguf", ("m", 1, 3)),
        ("dir/Model-Q4_K_M-00002-of-00002.gguf", ("dir/Model-Q4_K_M", 2, 2)),
        ("Model-Q4_K_M.gguf", None),
        ("m-1-of-3.gguf", None),
    ],
)
def test_shard_info(path, expected):
    assert shard_info(path) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("Meta-Llama-3.1-8B-Instruct-Q8_0.gguf", "Q8_0"),
        ("Model-IQ4_XS.gguf", "IQ4_XS"),
        ("Model-F16-00001-of-00003.gguf", "F16"),
        ("model-bf16.gguf", "BF16"),
        ("model-fp16.gguf", "F16"),
        ("model.gguf", None),
    ],
)
def test_quant_of(path, expected):
    assert quant_of(path) == expected


@pytest.mark.parametrize(
    ("gguf_file", "expected"),
    [
        ("Model-Q4_K_M.gguf", ("Model-Q4_K_M.gguf",)),
        (
            "Model-F16-00001-of-00003.gguf",
            ("Model-F16-00001-of-00003.gguf", "Model-F16-00002-of-00003.gguf", "Model-F16-00003-of-00003.gguf"),
        ),
    ],
)
def test_shard_group(gguf_file, expected):
    assert shard_group("r/m", GGUF_REPO, gguf_file) == expected


@pytest.mark.parametrize(
    ("files", "gguf_file", "message"),
    [
        (GGUF_REPO, "Model-Q5_K_M.gguf", "has no file"),
        ([f for f in GGUF_REPO if "00002" not in f.path], "Model-F16-00001-of-00003.gguf", "incomplete"),
    ],
)
def test_shard_group_refuses_missing_or_partial(files, gguf_file, message):
    with pytest.raises(SelectionError, match=message):
        shard_group("r/m", files, gguf_file)


def test_gguf_candidates_are_one_per_artifact_without_projectors():
    assert gguf_candidates(GGUF_REPO) == (
        "Model-F16-00001-of-00003.gguf", "Model-Q2_K.gguf", "Model-Q4_K_M.gguf", "Model-Q8_0.gguf",
    )


@pytest.mark.parametrize(
    ("files", "preference", "pinned", "expected"),
    [
        (GGUF_REPO, ("Q4_K_M", "Q8_0"), None, "Model-Q4_K_M.gguf"),
        (GGUF_REPO, ("Q8_0", "Q4_K_M"), None, "Model-Q8_0.gguf"),
        (GGUF_REPO, ("F16",), None, "Model-F16-00001-of-00003.gguf"),
        (GGUF_REPO, ("Q4_K_M",), "Model-Q2_K.gguf", "Model-Q2_K.gguf"),  # a pin beats preference
        ([RepoFile("only.gguf", 1)], ("Q4_K_M",), None, "only.gguf"),  # a lone artifact
        (
            [RepoFile("sub/m-Q4_K_M.gguf", 1), RepoFile("m-Q4_K_M.gguf", 1)], ("Q4_K_M",), None, "m-Q4_K_M.gguf",
        ),
    ],
)
def test_choose_gguf_file(files, preference, pinned, expected):
    assert choose_gguf_file("r/m", files, preference, pinned) == expected


@pytest.mark.parametrize(
    ("files", "preference", "message"),
    [
        ([RepoFile("README.md", 1)], ("Q4_K_M",), "no GGUF model file"),
        ([RepoFile("a.gguf", 1), RepoFile("b.gguf", 1)], ("Q4_K_M",), "no preferred quant"),
    ],
)
def test_choose_gguf_file_errors(files, preference, message):
    with pytest.raises(SelectionError, match=message):
        choose_gguf_file("r/m", files, preference)


def test_select_safetensors_takes_config_tokenizer_weights_and_index_only():
    assert select_files("r/m", "safetensors", MLX_REPO) == (
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    )


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([RepoFile("model.safetensors", 1)], "no top-level config.json"),
        ([RepoFile("config.json", 1), RepoFile("pytorch_model.bin", 1)], "no top-level"),
        ([RepoFile("config.json", 1), RepoFile("sub/model.safetensors", 1)], "no top-level"),
    ],
)
def test_select_safetensors_refuses_non_models(files, message):
    with pytest.raises(SelectionError, match=message):
        select_files("r/m", "safetensors", files)


@pytest.mark.parametrize(
    ("gguf_file", "expected"),
    [
        ("Model-Q8_0.gguf", ("Model-Q8_0.gguf",)),
        (None, ("Model-Q4_K_M.gguf",)),  # no pin: the preference order
    ],
)
def test_select_gguf(gguf_file, expected):
    assert select_files("r/m", "gguf", GGUF_REPO, gguf_file) == expected


@pytest.mark.parametrize(("files", "expected"), [(GGUF_REPO, True), (MLX_REPO, False), ([], False)])
def test_is_gguf_repo(files, expected):
    assert is_gguf_repo(files) is expected


def test_total_size_counts_selected_files_only():
    assert total_size_bytes(GGUF_REPO, ["Model-Q8_0.gguf", "README.md"]) == 9
    assert total_size_bytes([RepoFile("a", None)], ["a"]) == 0
