"""A card's speculative method (`runtime.speculative`): served only by an engine that can
(llama-server's n-gram and draft-model drafting, MLX's too, vLLM's n-gram), on one node,
refused by name where no engine of the card can."""

import pytest

from skulk.master.placement import SpeculativeUnsupported, place
from skulk.shared.types.speculative import request_refusal, speculative_refusal
from tests.master.test_placement import GB, GGUF_8B, LLAMA_CPU, cluster, ids, request, served_res

NGRAM = GGUF_8B.model_copy(update={"runtime": GGUF_8B.runtime.model_copy(update={"speculative": "ngram"})})
SERVED_AND_IN_PROCESS = ("llama_cpp", "llama_cpp-cpu", "llama_server", "llama_server-cpu")


@pytest.mark.parametrize(("backend", "method", "refused"), [
    ("llama_server-cpu", "ngram", False),
    ("llama_server-cuda", "ngram", False),
    ("llama_cpp-cpu", "ngram", True),
    ("mlx-metal", "ngram", False),
    ("mlx-metal", "draft", False),
    ("mlx-cpu", "draft", False),
    ("vllm-cuda", "ngram", False),
    ("llama_cpp-cpu", "none", False),
    ("llama_server-cpu", "draft", False),
    ("llama_cpp-cpu", "draft", True),
    ("vllm-cuda", "draft", True),
])
def test_speculative_refusal(backend, method, refused):
    assert (speculative_refusal(backend, method) is not None) is refused


@pytest.mark.parametrize(("method", "asked", "refused"), [
    (None, None, None),
    ("ngram", None, None),
    ("ngram", True, None),
    ("draft", True, None),
    (None, False, None),
    ("none", False, None),
    ("ngram", False, "a request cannot turn it off"),
    ("draft", False, "is served with draft speculation"),
    (None, True, "a request cannot turn it on"),
])
def test_a_requests_speculative_is_honoured_only_as_the_model_is_served(method, asked, refused):
    why = request_refusal(method, asked)
    assert (why is None) if refused is None else (why is not None and refused in why)


def test_a_speculating_card_is_served_by_llama_server_only():
    reading = served_res("a", 60 * GB, backends=SERVED_AND_IN_PROCESS)
    card = NGRAM.model_copy(update={"placement": NGRAM.placement.model_copy(update={
        "compatible_backends": SERVED_AND_IN_PROCESS, "backend_preference": ("llama_cpp-cpu", "llama_server-cpu")})})
    instance = place(card, cluster("a"), {"a": reading}, request(card), new_id=ids())
    # The card ranks the in-process engine first, but only llama-server drafts.
    assert [s.backend for s in instance.shards] == ["llama_server-cpu"]


def test_a_node_without_a_speculating_engine_cannot_serve_the_card():
    reading = served_res("a", 60 * GB, backends=LLAMA_CPU)
    only_in_process = NGRAM.model_copy(update={"placement": NGRAM.placement.model_copy(update={
        "compatible_backends": LLAMA_CPU, "backend_preference": ()})})
    with pytest.raises(SpeculativeUnsupported, match="llama_cpp engine serves speculative methods: none") as caught:
        place(only_in_process, cluster("a"), {"a": reading}, request(only_in_process), new_id=ids())
    assert caught.value.code == "speculative_unsupported"


def test_the_removed_multi_node_gate_is_refused_by_name():
    from pydantic import ValidationError

    from skulk.shared.types.cards import RuntimeSection

    with pytest.raises(ValidationError, match=r"runtime\.speculative_multi_node was removed: Skulk speculates on one node"):
        RuntimeSection.model_validate({"speculativeMultiNode": False})


def test_a_node_without_the_engine_the_card_needs_is_named_with_the_reason():
    """The card allows llama-server and in-process llama.cpp, but only llama-server drafts:
    a cluster of in-process-only nodes is told which tags remain, and why."""
    from skulk.master.placement import NoCompatibleBackend

    reading = served_res("a", 60 * GB, backends=LLAMA_CPU)
    card = NGRAM.model_copy(update={"placement": NGRAM.placement.model_copy(update={
        "compatible_backends": SERVED_AND_IN_PROCESS, "backend_preference": ()})})
    with pytest.raises(NoCompatibleBackend, match=r"\['llama_server', 'llama_server-cpu'\] \(for a f16 KV cache, "
                                                  r"speculation ngram\)"):
        place(card, cluster("a"), {"a": reading}, request(card), new_id=ids())


def _mlx_speculating(method: str):
    """The 1B MLX card asking for `method`; 'draft' with a safetensors draft repo a tenth its size."""
    from tests.master.test_placement import LLAMA_1B

    data = {**LLAMA_1B.model_dump(by_alias=False), "runtime": {"speculative": method}}
    if method == "draft":
        data.update(served_spec_draft_repo="mlx-community/Llama-3.2-draft-4bit",
                    served_spec_draft_size_bytes=LLAMA_1B.storage_size_bytes // 10)
    return type(LLAMA_1B).model_validate(data)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_an_mlx_card_asking_for_speculation_is_placed_on_one_node_or_not_at_all(method):
    from skulk.master.placement import MemoryShortfall, ShardingUnsupported
    from tests.master.test_placement import LLAMA_1B, res

    card = _mlx_speculating(method)
    roomy = {"a": res("a", 3 * GB), "b": res("b", 3 * GB)}
    instance = place(card, cluster("ab", ["a-b"]), roomy, request(card), new_id=ids())
    assert len(instance.shards) == 1 and instance.shards[0].backend.startswith("mlx")
    with pytest.raises(ShardingUnsupported, match=f"the card speculates \\({method}\\), which every engine does "
                                                  "on one node"):
        place(card, cluster("ab", ["a-b"]), roomy, request(card, min_nodes=2), new_id=ids())
    # Too big for either node alone: the plain card spans both, the speculating one does not.
    tight = {"a": res("a", int(1.2 * GB)), "b": res("b", int(1.2 * GB))}
    assert len(place(LLAMA_1B, cluster("ab", ["a-b"]), tight, request(LLAMA_1B), new_id=ids()).shards) == 2
    with pytest.raises(MemoryShortfall):
        place(card, cluster("ab", ["a-b"]), tight, request(card), new_id=ids())
