"""The shared token loops (skulk.worker.engines.token_loop) over scripted token sources: the
bookkeeping every engine relies on, checked once, without an engine library."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from skulk.worker.engines.base import EngineError, GeneratedToken, usage_of
from skulk.worker.engines.token_loop import max_new_tokens, relay_served, token_loop

EOS = 0
VOCAB = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld", 5: b"\xc3", 6: b"\xa9", 7: b"STOP", 8: b"!"}


def run(ids, *, max_new=100, stop=(), cancel_after=None, cached=0, **kw) -> list[GeneratedToken]:
    cancelled = threading.Event()
    source = iter(ids)
    drawn = 0

    def next_token() -> int:
        nonlocal drawn
        drawn += 1
        if cancel_after is not None and drawn > cancel_after:
            cancelled.set()
        return next(source)

    return list(token_loop(next_token, VOCAB.__getitem__, {EOS}.__contains__, n_prompt=4, max_new=max_new,
                           stop=list(stop), cancelled=cancelled, cached=cached, **kw))


def texts(tokens):
    return [t.text for t in tokens]


@pytest.mark.parametrize(("ids", "kw", "text", "finish", "completion"), [
    # End-of-generation: "stop", its own text empty.
    ([1, 2, EOS], {}, ["Hel", "lo", ""], "stop", 3),
    # max_tokens (or the full context) reached: "length" on the token that reached it.
    ([1, 2, 3, 4], {"max_new": 2}, ["Hel", "lo"], "length", 2),
    # A stop string across two tokens: held back, then dropped; "stop".
    ([1, 2, 3, 7, 8], {"stop": ["wSTOP", " worSTOP"]}, ["Hel", "lo", "", ""], "stop", 4),
    # Held text that turns out not to be a stop string is released.
    ([1, 3, 4, EOS], {"stop": [" world!"]}, ["Hel", "", "", " world"], "stop", 4),
    # Held text is flushed on "length" too.
    ([1, 3], {"stop": [" world!"], "max_new": 2}, ["Hel", " wor"], "length", 2),
    # A UTF-8 sequence split over two tokens is held until whole.
    ([5, 6, EOS], {}, ["", "é", ""], "stop", 3),
])
def test_finishes(ids, kw, text, finish, completion):
    tokens = run(ids, **kw)
    assert texts(tokens) == text
    assert [t.finish_reason for t in tokens[:-1]] == [None] * (len(tokens) - 1)
    assert tokens[-1].finish_reason == finish
    assert tokens[-1].usage == usage_of(4, completion)
    assert all(t.usage is None for t in tokens[:-1])


def test_a_matched_stop_string_is_named():
    tokens = run([1, 7, 8], stop=["STOP"])
    assert tokens[-1].stop_sequence == "STOP" and tokens[-1].text == ""
    assert run([1, 2, EOS], stop=["STOP"])[-1].stop_sequence is None


def test_the_first_token_says_the_prompt_length_once():
    tokens = run([1, 2, EOS])
    assert [t.prompt_tokens for t in tokens] == [4, None, None]
    assert run([EOS])[0].prompt_tokens == 4  # also when the first token is the last
    assert [t.prompt_tokens for t in run([1, 2, EOS], announce_prompt=False)] == [None, None, None]


def test_first_touches_only_the_first_token():
    tokens = run([1, 2, EOS], first=lambda out: replace(out, text=out.text.upper()))
    assert texts(tokens) == ["HEL", "lo", ""]


def test_cached_prompt_tokens_are_counted():
    assert run([1, EOS], cached=3)[-1].usage == usage_of(4, 2, 3)


def test_cancellation_ends_silently_before_the_token_is_used():
    # Cancelled while the third token was sampled: two tokens out, no finish, no error.
    tokens = run([1, 2, 3, 4, EOS], cancel_after=2)
    assert texts(tokens) == ["Hel", "lo"] and tokens[-1].finish_reason is None


def test_no_token_is_sampled_after_the_finish():
    drawn = []

    def next_token() -> int:
        drawn.append(1)
        return 1

    list(token_loop(next_token, VOCAB.__getitem__, {EOS}.__contains__, n_prompt=1, max_new=3, stop=[],
                    cancelled=threading.Event()))
    assert len(drawn) == 3


def test_make_builds_every_token():
    made = []

    def make(text, token, finish, usage):
        made.append(token)
        return GeneratedToken(text, token, finish, usage)

    run([1, 2, EOS], make=make)
    assert made == [1, 2, EOS]


@pytest.mark.parametrize(("max_tokens", "n_prompt", "n_ctx", "expected"), [
    (None, 10, 100, 90), (5, 10, 100, 5), (500, 10, 100, 90), (0, 10, 100, 0),
])
def test_max_new_tokens(max_tokens, n_prompt, n_ctx, expected):
    assert max_new_tokens(max_tokens, n_prompt, n_ctx) == expected


# -- the served relay ---------------------------------------------------------------------


def parse(line: str):
    """A toy wire: 'a' -> a token, 'a.' -> a finishing token, '' -> nothing."""
    if not line:
        return ()
    return (GeneratedToken(line.rstrip("."), None, "stop" if line.endswith(".") else None),)


def relay(lines, *, cancelled=None, at_end=lambda: None):
    return list(relay_served(iter(lines), parse, cancelled or threading.Event(), unfinished="server cut",
                             at_end=at_end))


def test_relay_ends_at_the_finish():
    assert texts(relay(["a", "", "b.", "c"])) == ["a", "b"]


def test_relay_fails_typed_when_the_stream_ends_without_a_finish():
    with pytest.raises(EngineError, match="server cut"):
        relay(["a", "b"])


def test_relay_yields_a_held_finish_at_the_end():
    held = GeneratedToken("", None, "length", usage_of(1, 2))
    assert relay(["a"], at_end=lambda: held)[-1] is held


def test_relay_ends_silently_when_cancelled():
    cancelled = threading.Event()

    def lines():
        yield "a"
        cancelled.set()
        yield "b"

    assert texts(list(relay_served(lines(), parse, cancelled, unfinished="x"))) == ["a"]
