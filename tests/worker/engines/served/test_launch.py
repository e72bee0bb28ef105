from pathlib import Path

import pytest

from skulk.shared.types.common import Usage
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken
from skulk.worker.engines.served.launch import (
    DEFAULT_SLOTS,
    InvalidSlotCount,
    ServedRequestRejected,
    ServerLaunch,
    completion_body,
    server_env,
    slot_count,
    tokens_of_event,
)


@pytest.mark.parametrize(("setting", "slots"), [(None, DEFAULT_SLOTS), ("", DEFAULT_SLOTS), ("8", 8), (" 1 ", 1), ("64", 64)])
def test_slot_count(setting, slots):
    assert slot_count(setting) == slots


@pytest.mark.parametrize(("setting", "says"), [("0", "outside 1..64"), ("-2", "outside"), ("65", "outside"), ("four", "whole number"), ("2.5", "whole number")])
def test_bad_slot_setting_is_refused_typed(setting, says):
    with pytest.raises(InvalidSlotCount, match=says) as caught:
        slot_count(setting)
    assert caught.value.error_type == "InvalidSlotCount"
    assert "SKULK_LLAMA_SERVER_PARALLEL" in str(caught.value)


def test_argv_sizes_the_cache_per_slot_and_listens_on_loopback():
    argv = ServerLaunch(Path("/bin/ls"), Path("/m.gguf"), 4000, 8, 512, 2, 0, True).argv()
    flags = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == "/bin/ls"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "4000"
    assert flags["--parallel"] == "8" and flags["--ctx-size"] == str(8 * 512)
    assert "--cont-batching" in argv and "--no-kv-unified" in argv


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
