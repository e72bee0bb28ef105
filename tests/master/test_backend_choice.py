import pytest

from skulk.master.backend_choice import serving_order
from skulk.models.cards import builtin_cards_dir, load_card


def card_with(compatible, preference=()):
    card = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    placement = card.placement.model_copy(update={"compatible_backends": tuple(compatible), "backend_preference": tuple(preference)})
    return card.model_copy(update={"placement": placement})


@pytest.mark.parametrize(
    ("compatible", "preference", "order"),
    [
        # No served tags allowed: the card's order, untouched.
        (["llama_cpp", "llama_cpp-cpu"], [], ("llama_cpp", "llama_cpp-cpu")),
        # Served twins go right before their in-process tag.
        (
            ["llama_cpp-cpu", "llama_cpp", "llama_server-cpu", "llama_server"],
            [],
            ("llama_server-cpu", "llama_cpp-cpu", "llama_server", "llama_cpp", ),
        ),
        # A preference that ranks only llama_cpp tags still gets the twins promoted.
        (
            ["llama_cpp-cuda", "llama_cpp-cpu", "llama_server-cuda", "llama_server-cpu"],
            ["llama_cpp-cuda", "llama_cpp-cpu"],
            ("llama_server-cuda", "llama_cpp-cuda", "llama_server-cpu", "llama_cpp-cpu"),
        ),
        # The operator ranked the served engine: the card decides (in-process first here).
        (
            ["llama_cpp-cpu", "llama_server-cpu"],
            ["llama_cpp-cpu", "llama_server-cpu"],
            ("llama_cpp-cpu", "llama_server-cpu"),
        ),
        # A twin the card does not allow is never invented.
        (["llama_cpp-cuda", "llama_cpp-cpu", "llama_server-cpu"], [], ("llama_cpp-cuda", "llama_server-cpu", "llama_cpp-cpu")),
    ],
)
def test_serving_order(compatible, preference, order):
    assert serving_order(card_with(compatible, preference)) == order


def test_builtin_gguf_cards_prefer_the_served_engine_on_the_same_compute():
    order = serving_order(load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml"))
    assert order.index("llama_server-cpu") == order.index("llama_cpp-cpu") - 1
    assert order.index("llama_server-cuda") < order.index("llama_cpp-cuda")


def test_an_embedding_model_keeps_the_in_process_engine_first():
    card = card_with(["llama_cpp-cpu", "llama_server-cpu"])
    embedding = card.model_copy(update={"tasks": ("TextGeneration", "Embedding"), "capabilities": ("text", "embedding")})
    assert serving_order(embedding) == ("llama_cpp-cpu", "llama_server-cpu")
    assert serving_order(card) == ("llama_server-cpu", "llama_cpp-cpu")


def test_a_card_built_from_a_gguf_serves_on_llama_server_first():
    """Cards built from a hub repo, a local path or an Ollama name allow llama-server, so a
    node that has one serves a user's model with its slots, not one request at a time."""
    from skulk.models.card_builder import GGUF_BACKENDS, GGUF_PREFERENCE

    card = card_with(GGUF_BACKENDS, GGUF_PREFERENCE)
    order = serving_order(card)
    assert order.index("llama_server-cpu") < order.index("llama_cpp-cpu")
    assert order.index("llama_server-cuda") < order.index("llama_cpp-cuda")
