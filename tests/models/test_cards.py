"""Model cards: built-ins are valid, bad files are rejected by name and field, custom cards
override built-ins, and the writer round-trips."""

from __future__ import annotations

import pickle
import tomllib
from pathlib import Path
from typing import Any

import pytest

from skulk.models.cards import (
    CardError,
    builtin_cards_dir,
    card_file_name,
    delete_custom_card,
    dump_card,
    load_card,
    load_cards,
    resolve_cards,
    write_custom_card,
)
from skulk.shared.types.cards import ModelCard

BUILTIN_DIR = builtin_cards_dir()
BUILTIN_FILES = sorted(BUILTIN_DIR.glob("*.toml"))

REQUIRED_BUILTINS = {
    "mlx-community/Llama-3.2-1B-Instruct-4bit",
    "mlx-community/Llama-3.2-3B-Instruct-4bit",
    "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
    "mlx-community/Qwen2.5-7B-Instruct-4bit",
    "mlx-community/gemma-3-4b-it-4bit",
    "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
    "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
    "bartowski/Mistral-7B-Instruct-v0.3-GGUF",
    "local/tiny-llama",
    "local/tiny-llama-gguf",
}


# The generator of the tiny test model must produce exactly this shape.
TINY_SHAPE = dict(
    source="local-generated",
    family="llama",
    num_layers=6,
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    context_length=2048,
)


def base_card(**overrides: Any) -> dict[str, Any]:
    """A valid MLX card as TOML-shaped data; tests change one thing at a time."""
    data: dict[str, Any] = {
        "model_id": "someone/Some-Model-4bit",
        "name": "Some Model",
        "family": "llama",
        "quantization": "4bit",
        "storage_size_bytes": 1_000_000,
        "tasks": ["TextGeneration"],
        "capabilities": ["text"],
        "num_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "context_length": 4096,
        "placement": {"compatible_backends": ["mlx", "mlx-cpu"], "backend_preference": ["mlx-cpu"]},
    }
    data.update(overrides)
    return data


def gguf_card(**overrides: Any) -> dict[str, Any]:
    data = base_card(
        model_id="someone/Some-Model-GGUF",
        quantization="Q4_K_M",
        gguf_file="some-model-q4_k_m.gguf",
        placement={"compatible_backends": ["llama_cpp", "llama_cpp-cuda"], "backend_preference": ["llama_cpp-cuda"]},
    )
    data.update(overrides)
    return data


def placement_card(backends: list[str], **placement: Any) -> dict[str, Any]:
    return base_card(placement={"compatible_backends": backends, **placement})


def write_toml(directory: Path, data: dict[str, Any], name: str | None = None) -> Path:
    """Write card data with the module's own dumper, bypassing validation."""
    from skulk.models import cards as cards_module

    lines: list[str] = []
    cards_module._toml_table(data, "", lines)
    path = directory / (name or card_file_name(data["model_id"]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- built-ins ----------------------------------------------------------------------------


def test_builtin_dir_holds_every_required_card() -> None:
    loaded = load_cards(BUILTIN_DIR)
    assert loaded.errors == ()
    assert set(loaded.cards) >= REQUIRED_BUILTINS


@pytest.mark.parametrize("path", BUILTIN_FILES, ids=lambda p: p.stem)
def test_builtin_card_loads_and_is_named_for_its_id(path: Path) -> None:
    card = load_card(path)
    assert path.name == card_file_name(card.model_id)
    # A built-in round-trips through both the TOML writer and the camelCase wire.
    assert ModelCard.model_validate(tomllib.loads(dump_card(card))) == card
    assert ModelCard.model_validate(card.to_wire()) == card


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        (
            "mlx-community/Llama-3.2-1B-Instruct-4bit",
            dict(num_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64),
        ),
        ("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", dict(num_layers=32, num_key_value_heads=8, head_dim=128)),
        ("mlx-community/Qwen2.5-7B-Instruct-4bit", dict(num_layers=28, num_key_value_heads=4, sliding_window=None)),
        ("mlx-community/gemma-3-4b-it-4bit", dict(num_layers=34, sliding_window=1024, sliding_window_pattern=6)),
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF", dict(gguf_file="qwen2.5-0.5b-instruct-q4_k_m.gguf", num_layers=24)),
        ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", dict(quantization="Q4_K_M", num_layers=32)),
        ("bartowski/Mistral-7B-Instruct-v0.3-GGUF", dict(quantization="Q4_K_M", vocab_size=32768)),
        ("local/tiny-llama", TINY_SHAPE),
        ("local/tiny-llama-gguf", TINY_SHAPE),
    ],
)
def test_builtin_card_shape(model_id: str, expected: dict[str, Any]) -> None:
    card = load_cards(BUILTIN_DIR).cards[model_id]
    assert {key: getattr(card, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("model_id", "is_gguf", "best_backend"),
    [
        ("local/tiny-llama", False, "mlx-metal"),
        ("local/tiny-llama-gguf", True, "llama_cpp-cuda"),
        ("mlx-community/Llama-3.2-1B-Instruct-4bit", False, "mlx-metal"),
        ("bartowski/Mistral-7B-Instruct-v0.3-GGUF", True, "llama_cpp-cuda"),
    ],
)
def test_builtin_engine_routing(model_id: str, is_gguf: bool, best_backend: str) -> None:
    card = load_cards(BUILTIN_DIR).cards[model_id]
    assert card.is_gguf is is_gguf
    assert card.ordered_backends[0] == best_backend
    assert set(card.ordered_backends) == set(card.placement.compatible_backends)


def test_tiny_gguf_prefers_every_gpu_before_cpu() -> None:
    order = load_cards(BUILTIN_DIR).cards["local/tiny-llama-gguf"].ordered_backends
    assert {t for t in order if t.startswith("llama_cpp")} == {"llama_cpp", "llama_cpp-cpu", "llama_cpp-cuda", "llama_cpp-vulkan", "llama_cpp-metal"}
    assert {t for t in order if t.startswith("llama_server")} == {"llama_server", "llama_server-cpu", "llama_server-cuda", "llama_server-vulkan", "llama_server-metal"}
    cpu = order.index("llama_cpp-cpu")
    assert all(order.index(gpu) < cpu for gpu in ("llama_cpp-cuda", "llama_cpp-vulkan", "llama_cpp-metal"))


# --- the sliding-window rule the capacity planner relies on -------------------------------


@pytest.mark.parametrize(
    ("window", "pattern", "num_layers", "global_layers"),
    [
        (None, None, 8, [0, 1, 2, 3, 4, 5, 6, 7]),  # no window: all global
        (512, None, 8, []),  # window without pattern: all windowed
        (512, 2, 8, [1, 3, 5, 7]),  # Gemma 2 style alternation
        (1024, 6, 34, [5, 11, 17, 23, 29]),  # Gemma 3: 5 windowed then 1 global
    ],
)
def test_windowed_layer_rule(
    window: int | None, pattern: int | None, num_layers: int, global_layers: list[int]
) -> None:
    card = ModelCard.model_validate(
        base_card(sliding_window=window, sliding_window_pattern=pattern, num_layers=num_layers)
    )
    assert [i for i in range(num_layers) if not card.is_windowed_layer(i)] == global_layers


# --- rejected cards -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "message_part"),
    [
        (base_card(flavour="vanilla"), "flavour", "unknown key"),
        (base_card(placement={"compatible_backends": ["mlx"], "speed": 3}), "placement.speed", "unknown key"),
        (base_card(num_layers="16"), "num_layers", "valid integer"),
        (base_card(num_layers=True), "num_layers", "valid integer"),
        (base_card(num_layers=0), "num_layers", "greater than 0"),
        ({k: v for k, v in base_card().items() if k != "head_dim"}, "head_dim", "required field is missing"),
        (base_card(family="gpt9"), "family", "'gpt9' is not an architecture the"),
        (base_card(num_key_value_heads=3), "num_key_value_heads", "not a multiple"),
        (base_card(sliding_window_pattern=6), "sliding_window_pattern", "without sliding_window"),
        (base_card(model_id="no-owner"), "model_id", "not a model id"),
        (base_card(model_id="a--b/c"), "model_id", "not a model id"),
        (base_card(tasks=["TextGeneration", "TextGeneration"]), "tasks", "duplicate"),
        (base_card(tasks=["Embedding"]), "capabilities", "declared together"),
        (base_card(capabilities=["text", "tools"]), "tooling.tool_call_format", "'tools'"),
        (base_card(reasoning={"format": "think_tags"}), "reasoning.start_tag", "required"),
        (base_card(source_revision="main"), "source_revision", "commit pin"),
        (base_card(source="local-path"), "model_id", "local/"),
        (base_card(model_id="local/x", source="local-path"), "local_path", "required"),
        (base_card(local_path="/models/x"), "local_path", "only meaningful"),
        (
            base_card(model_id="local/x", source="local-generated", source_revision="0" * 40),
            "source_revision",
            "huggingface",
        ),
        (
            base_card(placement={"compatible_backends": ["mlx"], "backend_preference": ["llama_cpp-cuda"]}),
            "placement.backend_preference",
            "'llama_cpp-cuda' is not in compatible_backends",
        ),
        (placement_card([]), "placement.compatible_backends", "at least 1"),
        (placement_card(["mlx-tpu"]), "placement.compatible_backends[0]", "unknown compute"),
        (placement_card(["torch"]), "placement.compatible_backends[0]", "unknown engine"),
        (placement_card(["mlx", "llama_cpp"]), "placement.compatible_backends", "one artifact"),
        (
            placement_card(["mlx"], max_pipeline_split_layer=9),
            "placement.max_pipeline_split_layer",
            "exceeds num_layers",
        ),
        (base_card(runtime={"flash_attn": "yes"}), "runtime.flash_attn", "valid boolean"),
        (base_card(gguf_file="x.gguf"), "gguf_file", "no GGUF engine"),
        ({k: v for k, v in gguf_card().items() if k != "gguf_file"}, "gguf_file", "required for a GGUF card"),
        (gguf_card(gguf_file="../escape.gguf"), "gguf_file", "repo-relative"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_card_names_file_and_field(
    tmp_path: Path, data: dict[str, Any], field: str, message_part: str
) -> None:
    good = write_toml(tmp_path, base_card(model_id="someone/Good-Model"))
    bad = write_toml(tmp_path, data, name="bad-card.toml")

    with pytest.raises(CardError) as caught:
        load_card(bad)
    error = caught.value
    assert (error.path, error.field) == (bad, field)
    assert message_part in error.message
    assert str(error).startswith(f"bad card {bad}: field {field}: ")

    loaded = load_cards(tmp_path)
    assert list(loaded.cards) == ["someone/Good-Model"]
    assert [e.path for e in loaded.errors] == [bad]
    assert good.exists()


def test_preference_error_reads_as_documented(tmp_path: Path) -> None:
    path = write_toml(tmp_path, placement_card(["mlx"], backend_preference=["llama_cpp-cuda"]))
    with pytest.raises(CardError) as caught:
        load_card(path)
    assert str(caught.value) == (
        f"bad card {path}: field placement.backend_preference: 'llama_cpp-cuda' is not in compatible_backends"
    )


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('model_id = "a/b"\nname = "x"\nnum_layers = = 3\n', encoding="utf-8")
    with pytest.raises(CardError) as caught:
        load_card(path)
    assert caught.value.line == 3 and caught.value.field is None
    assert str(caught.value).startswith(f"bad card {path}: line 3: invalid TOML")


@pytest.mark.parametrize(
    ("content", "message_part"),
    [(b"\xff\xfe junk", "UTF-8"), (None, "cannot read")],
)
def test_unreadable_card_is_reported(tmp_path: Path, content: bytes | None, message_part: str) -> None:
    path = tmp_path / "x--y.toml"
    if content is None:
        path.mkdir()  # a directory where a card should be: load_card cannot read it
    else:
        path.write_bytes(content)
    with pytest.raises(CardError) as caught:
        load_card(path)
    assert caught.value.path == path and message_part in caught.value.message


def test_card_error_survives_pickling() -> None:
    error = CardError(Path("/x/y.toml"), "name", "bad", None)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


@pytest.mark.parametrize(
    ("file_name", "message_part"),
    [("someone--Other.toml", "must live in a file named"), ("renamed.toml", "must live in a file named")],
)
def test_card_file_must_be_named_for_its_model_id(tmp_path: Path, file_name: str, message_part: str) -> None:
    write_toml(tmp_path, base_card(), name=file_name)
    loaded = load_cards(tmp_path)
    assert loaded.cards == {}
    assert loaded.errors[0].field == "model_id" and message_part in loaded.errors[0].message


def test_non_card_files_are_ignored(tmp_path: Path) -> None:
    write_toml(tmp_path, base_card())
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / ".someone--Some-Model-4bit.toml.abc.tmp").write_text("half written")
    (tmp_path / ".hidden.toml").write_text("= broken")
    loaded = load_cards(tmp_path)
    assert list(loaded.cards) == ["someone/Some-Model-4bit"] and loaded.errors == ()


def test_missing_directory_is_empty() -> None:
    assert load_cards(Path("/nonexistent/skulk/cards")).cards == {}
    assert load_cards(None).errors == ()


# --- resolution ---------------------------------------------------------------------------


def test_custom_card_overrides_builtin(tmp_path: Path) -> None:
    builtin = load_cards(BUILTIN_DIR).cards["local/tiny-llama"]
    override = builtin.model_copy(update={"name": "My tiny llama", "context_length": 1024})
    write_custom_card(tmp_path, override)

    resolved = resolve_cards(BUILTIN_DIR, tmp_path)
    assert resolved.errors == ()
    assert resolved.cards["local/tiny-llama"] == override
    assert resolved.custom_ids == {"local/tiny-llama"}
    assert set(resolved.cards) >= REQUIRED_BUILTINS


def test_broken_custom_card_is_reported_and_hides_nothing(tmp_path: Path) -> None:
    write_custom_card(tmp_path, ModelCard.model_validate(base_card(model_id="someone/Custom-One")))
    broken = tmp_path / card_file_name("local/tiny-llama")
    broken.write_text('model_id = "local/tiny-llama"\nnum_layers = "six"\n', encoding="utf-8")

    resolved = resolve_cards(BUILTIN_DIR, tmp_path)
    assert [e.path for e in resolved.errors] == [broken]
    # The broken override leaves the built-in in effect, and every other card still loads.
    assert resolved.cards["local/tiny-llama"] == load_cards(BUILTIN_DIR).cards["local/tiny-llama"]
    assert "someone/Custom-One" in resolved.cards
    assert set(resolved.cards) >= REQUIRED_BUILTINS
    assert resolved.custom_ids == {"someone/Custom-One"}


def test_resolve_without_custom_dir() -> None:
    resolved = resolve_cards(BUILTIN_DIR, None)
    assert resolved.custom_ids == frozenset() and set(resolved.cards) >= REQUIRED_BUILTINS


# --- writing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        base_card(),
        gguf_card(source_revision="0123456789abcdef0123456789abcdef01234567"),
        base_card(
            name='Quote " backslash \\ tab \t newline \n unicode é',
            capabilities=["text", "tools", "thinking"],
            tooling={"tool_call_format": "hermes"},
            reasoning={"format": "think_tags", "start_tag": "<think>", "end_tag": "</think>"},
            runtime={"metal_fast_synch": False, "kv_cache_backend": "q8_0"},
            sliding_window=4096,
            sliding_window_pattern=2,
            placement={"compatible_backends": ["mlx"], "max_pipeline_split_layer": 6, "supports_tensor": True},
        ),
        base_card(model_id="local/on-disk", source="local-path", local_path="/srv/models/on disk"),
    ],
    ids=["mlx", "gguf-pinned", "every-section", "local-path"],
)
def test_write_then_load_round_trips(tmp_path: Path, data: dict[str, Any]) -> None:
    card = ModelCard.model_validate(data)
    path = write_custom_card(tmp_path / "custom", card)
    assert path == tmp_path / "custom" / card_file_name(card.model_id)
    assert load_card(path) == card
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left behind


def test_write_replaces_existing_card(tmp_path: Path) -> None:
    first = ModelCard.model_validate(base_card())
    write_custom_card(tmp_path, first)
    second = first.model_copy(update={"name": "Renamed"})
    write_custom_card(tmp_path, second)
    assert load_cards(tmp_path).cards == {first.model_id: second}


def test_delete_custom_card(tmp_path: Path) -> None:
    card = load_cards(BUILTIN_DIR).cards["local/tiny-llama"].model_copy(update={"name": "Override"})
    write_custom_card(tmp_path, card)

    assert delete_custom_card(tmp_path, card.model_id) is True
    assert delete_custom_card(tmp_path, card.model_id) is False
    assert delete_custom_card(tmp_path / "never-created", card.model_id) is False
    # Deleting the override re-exposes the built-in.
    assert resolve_cards(BUILTIN_DIR, tmp_path).cards[card.model_id].name != "Override"


def test_delete_rejects_non_model_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        delete_custom_card(tmp_path, "../../etc/passwd")
