from pathlib import Path

import pytest

from skulk.shared.types.common import Usage
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken
from skulk.worker.engines.served.launch import (
    InvalidSlotCount,
    ServedRequestRejected,
    ServerLaunch,
    assigned_slots,
    completion_body,
    image_prompt,
    server_env,
    tokens_of_event,
)


@pytest.mark.parametrize(("engine", "slots"), [("llama_server", 1), ("llama_server", 64), ("vllm", 256)])
def test_assigned_slots_within_the_engine_bound_are_kept(engine, slots):
    assert assigned_slots(engine, slots) == slots


@pytest.mark.parametrize(("engine", "slots", "names"), [
    ("llama_server", 65, "SKULK_LLAMA_SERVER_PARALLEL allows 1..64"),
    ("llama_server", 0, "1..64"),
    ("vllm", 257, "SKULK_VLLM_MAX_CONCURRENT_REQUESTS allows 1..256"),
])
def test_assigned_slots_beyond_the_engine_bound_are_refused_typed(engine, slots, names):
    with pytest.raises(InvalidSlotCount, match=names) as caught:
        assigned_slots(engine, slots)
    assert caught.value.error_type == "InvalidSlotCount"


def test_argv_sizes_the_cache_per_slot_and_listens_on_loopback():
    argv = ServerLaunch(Path("/bin/ls"), Path("/m.gguf"), 4000, 8, 512, 2, 0, True).argv()
    flags = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == "/bin/ls"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "4000"
    assert flags["--parallel"] == "8" and flags["--ctx-size"] == str(8 * 512)
    assert "--cont-batching" in argv and "--no-kv-unified" in argv
    assert flags["--cache-ram"] == "0"  # no cold budget: no host-RAM prompt cache


def test_argv_gives_the_cold_budget_to_llama_servers_prompt_cache():
    argv = ServerLaunch(Path("/bin/ls"), Path("/m.gguf"), 4000, 1, 512, 2, 0, True, cache_ram_mib=256).argv()
    assert dict(zip(argv[1::2], argv[2::2], strict=True))["--cache-ram"] == "256"


def test_the_final_event_reports_prompt_tokens_reused_from_the_slot_cache():
    [token] = tokens_of_event({"content": "", "tokens": [], "stop": True, "stop_type": "eos", "tokens_evaluated": 40,
                               "tokens_predicted": 3, "timings": {"cache_n": 32, "prompt_n": 8}}, False, 0)
    assert token.usage is not None and (token.usage.prompt_tokens, token.usage.cached_tokens) == (40, 32)


def test_server_env_drops_llama_arg_variables():
    assert server_env({"PATH": "/bin", "LLAMA_ARG_N_PARALLEL": "99"}) == {"PATH": "/bin"}


def request(**fields):
    return TextGenerationParams(model_id="m", prompt="hi", **fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"n_predict": -1, "seed": -1, "stop": []}),
        ({"max_tokens": 5, "seed": 7, "stop": ["\n"]}, {"n_predict": 5, "seed": 7, "stop": ["\n"]}),
        ({"logprobs": True}, {"n_probs": 1}),
        ({"logprobs": True, "top_logprobs": 3}, {"n_probs": 3}),
        ({"temperature": 0.0, "top_k": 1, "top_p": 0.5}, {"temperature": 0.0, "top_k": 1, "top_p": 0.5}),
    ],
)
def test_completion_body(fields, expected):
    body = completion_body(request(**fields), "hi", None)
    assert body["stream"] is True and body["prompt"] == "hi"
    assert {k: body[k] for k in expected} == expected
    assert ("n_probs" in body) == bool(fields.get("logprobs"))


def test_grammar_rides_in_the_body_and_too_many_logprobs_are_refused():
    assert completion_body(request(), "hi", "root ::= \"x\"")["grammar"] == 'root ::= "x"'
    with pytest.raises(ServedRequestRejected):
        completion_body(request(logprobs=True, top_logprobs=21), "hi", None)


@pytest.mark.parametrize(
    ("event", "tokens"),
    [
        ({"content": "Hel", "tokens": [9], "stop": False}, [GeneratedToken("Hel", 9)]),
        ({"content": "", "tokens": [], "stop": False}, []),
        (
            {"content": "", "tokens": [], "stop": True, "stop_type": "eos", "tokens_evaluated": 4, "tokens_predicted": 3},
            [GeneratedToken("", None, "stop", Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7))],
        ),
        (
            {"content": "!", "tokens": [1], "stop": True, "stop_type": "limit", "tokens_evaluated": 1, "tokens_predicted": 1},
            [GeneratedToken("!", 1, "length", Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))],
        ),
        (
            {"content": "", "stop": True, "stop_type": "word", "tokens_evaluated": 2, "tokens_predicted": 2},
            [GeneratedToken("", None, "stop", Usage(prompt_tokens=2, completion_tokens=2, total_tokens=4))],
        ),
    ],
)
def test_tokens_of_event(event, tokens):
    assert tokens_of_event(event, False, 0) == tokens


def test_logprobs_of_event():
    event = {"content": "ab", "tokens": [1, 2], "stop": False, "completion_probabilities": [
        {"id": 1, "token": "a", "logprob": -0.5, "top_logprobs": [{"id": 1, "token": "a", "logprob": -0.5}, {"id": 3, "token": "c", "logprob": -1.5}]},
        {"id": 2, "token": "b", "logprob": -0.25, "top_logprobs": [{"id": 2, "token": "b", "logprob": -0.25}]},
    ]}
    first, second = tokens_of_event(event, True, 1)
    assert (first.text, first.token_id, first.logprob) == ("", 1, -0.5)
    assert [t.token for t in first.top_logprobs] == ["a"]
    assert (second.text, second.token_id, second.logprob) == ("ab", 2, -0.25)


def test_argv_loads_the_projector_only_when_there_is_one():
    assert "--mmproj" not in ServerLaunch(Path("/bin/ls"), Path("/m.gguf"), 4000, 1, 512, 2, 0, True).argv()
    argv = ServerLaunch(Path("/bin/ls"), Path("/m.gguf"), 4000, 1, 512, 2, 0, True,
                        projector_path=Path("/mmproj.gguf")).argv()
    assert argv[argv.index("--mmproj") + 1] == "/mmproj.gguf"


def test_image_prompt_puts_the_servers_marker_where_each_image_stands():
    black, white = (ImageInput.of(data, "image/png", 1, 1) for data in (b"black-png", b"white-png"))
    prompt = image_prompt(f"a{IMAGE_MARKER}b{IMAGE_MARKER}c", [black, white], "<__media_X__>")
    assert prompt == {"prompt_string": "a<__media_X__>b<__media_X__>c",
                      "multimodal_data": [black.data_b64, white.data_b64]}
    with pytest.raises(ServedRequestRejected, match="1 image markers for 2 images"):
        image_prompt(f"a{IMAGE_MARKER}", [black, white], "<__media_X__>")
