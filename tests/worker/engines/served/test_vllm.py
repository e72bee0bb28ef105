"""The vllm engine: its pure rules everywhere; a real `vllm serve` only on a CUDA machine."""

from __future__ import annotations

import json
import os
import threading

import pytest

from skulk.facts.nvml import collect_gpus
from skulk.shared.memory_estimate import VLLM_CONTEXT_CAP_TOKENS
from skulk.shared.types.common import ChatMessage, Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken
from skulk.worker.engines.served.vllm import (
    ProcessView,
    VllmEngine,
    VllmUnavailable,
    orphaned_engine_cores,
    refusal,
    request_body,
    tokens_of_chunk,
    vllm_argv,
)


def test_argv_caps_the_context_and_listens_on_loopback():
    argv = vllm_argv("/venv/bin/vllm", "/m", 9000, 8, 262_144)
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert argv[:3] == ["/venv/bin/vllm", "serve", "/m"]
    assert flags["--host"] == "127.0.0.1" and flags["--max-num-seqs"] == "8"
    assert flags["--max-model-len"] == str(VLLM_CONTEXT_CAP_TOKENS)


@pytest.mark.parametrize(("method", "config"), [
    (None, None),
    ("none", None),
    ("ngram", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}),
])
def test_a_speculating_card_starts_vllm_with_its_speculative_config(method, config):
    argv = vllm_argv("/venv/bin/vllm", "/m", 9000, 8, 4096, method)
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert (json.loads(flags["--speculative-config"]) if "--speculative-config" in flags else None) == config


def test_only_orphaned_engine_cores_are_swept():
    processes = [
        ProcessView(10, "VLLM::EngineCore", 1),  # orphan
        ProcessView(11, "VLLM::EngineCore", 9),  # a live server's core
        ProcessView(12, "python", 1),
    ]
    assert orphaned_engine_cores(processes) == [10]


def params(**fields):
    return TextGenerationParams(model_id=ModelId("m"), prompt="hi", **fields)


@pytest.mark.parametrize(
    ("fields", "refused"),
    [({}, False), ({"tool_choice": "auto"}, False), ({"logprobs": True}, True), ({"tool_choice": "required"}, True)],
)
def test_unsupported_fields_are_refused_not_ignored(fields, refused):
    assert (refusal(params(**fields)) is not None) is refused


@pytest.mark.parametrize(
    ("chunk", "tokens"),
    [
        ({"choices": [{"text": "He", "finish_reason": None}]}, [GeneratedToken("He")]),
        ({"choices": [{"delta": {"content": "llo"}, "finish_reason": None}]}, [GeneratedToken("llo")]),
        ({"choices": [{"text": "", "finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 5}},
         [GeneratedToken("", None, "length", Usage(prompt_tokens=2, completion_tokens=5, total_tokens=7))]),
        ({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}, []),
    ],
)
def test_tokens_of_chunk(chunk, tokens):
    assert tokens_of_chunk(chunk) == tokens


def test_the_request_body_carries_switches_and_a_turn_to_continue():
    chat = TextGenerationParams(model_id=ModelId("m"), messages=[ChatMessage(role="user", content="hi")],
                                thinking=True, max_tokens=9, temperature=0)
    path, body = request_body(chat, ("enable_thinking",))
    assert path == "/v1/chat/completions" and body["chat_template_kwargs"] == {"enable_thinking": True}
    assert "continue_final_message" not in body and body["max_tokens"] == 9 and body["temperature"] == 0
    _, body = request_body(chat.model_copy(update={"continue_from": "<think>so\n</think>\n\n"}), ("enable_thinking",))
    assert body["messages"][-1] == {"role": "assistant", "content": "<think>so\n</think>\n\n"}
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    path, body = request_body(TextGenerationParams(model_id=ModelId("m"), prompt="x"), ())
    assert path == "/v1/completions" and body["prompt"] == "x" and "messages" not in body


def test_without_a_cuda_gpu_load_is_refused_typed(tmp_path):
    if collect_gpus():
        pytest.skip("a CUDA GPU is visible here: the refusal path cannot be shown")
    from skulk.worker.engines.base import ShardSpec
    from tests.worker.tiny_gguf import tiny_gguf_card, tiny_instance

    card = tiny_gguf_card()
    spec = ShardSpec(instance=tiny_instance(card, backend="vllm-cuda"), runner_id=tiny_instance(card).shards[0].runner_id,
                     card=card, model_path=str(tmp_path))
    with pytest.raises(VllmUnavailable, match="CUDA GPU"):
        VllmEngine({"SKULK_VLLM_BIN": "/usr/bin/true"}).load(spec)


@pytest.mark.skipif(not (os.environ.get("SKULK_VLLM_BIN") and os.environ.get("SKULK_VLLM_TEST_MODEL")) or not collect_gpus(),
                    reason="vLLM serves only on a CUDA GPU: needs an NVIDIA GPU that NVML sees, SKULK_VLLM_BIN and "
                           "SKULK_VLLM_TEST_MODEL (a small HF model dir); bench/gpu/check.sh runs this on a GPU machine")
def test_vllm_streams_concurrently_on_a_gpu():
    model = os.environ["SKULK_VLLM_TEST_MODEL"]
    from skulk.worker.engines.base import ShardSpec
    from tests.worker.tiny_gguf import tiny_gguf_card, tiny_instance

    card = tiny_gguf_card()
    instance = tiny_instance(card, backend="vllm-cuda", context_token_limit=1024, slots=4)
    engine = VllmEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card, model_path=model))
    try:
        assert engine.concurrency == 4  # the stamped slots are its --max-num-seqs
        engine.warm_up()
        results: dict[int, list[GeneratedToken]] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(
            i, list(engine.generate(params(max_tokens=16, temperature=0), threading.Event())))) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(results) == 4 and all(r[-1].finish_reason == "length" for r in results.values())
    finally:
        engine.close()
