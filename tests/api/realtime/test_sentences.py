"""Sentences of a streamed answer (`skulk.api.realtime.sentences`)."""

from __future__ import annotations

import pytest

from skulk.api.realtime.sentences import MAX_SENTENCE_CHARS, split_sentences


@pytest.mark.parametrize(("text", "sentences", "rest"), [
    ("", [], ""),
    ("Hello", [], "Hello"),
    ("Hello.", [], "Hello."),  # the model may go on: "Hello.5 m"
    ("Hello. How", ["Hello."], " How"),
    ("Hi! Yes? No. ", ["Hi!", "Yes?", "No."], " "),
    ('He said "stop." Then', ['He said "stop."'], " Then"),
    ("One\nTwo\n\nThree", ["One", "Two"], "Three"),
    ("3.14 is pi. ", ["3.14 is pi."], " "),
    ("... well", ["..."], " well"),
    ("\n\n", [], ""),
])
def test_split(text: str, sentences: list[str], rest: str) -> None:
    assert split_sentences(text) == (sentences, rest)


def test_a_run_on_is_cut_at_a_space() -> None:
    text = "word " * (MAX_SENTENCE_CHARS // 5 + 10)
    sentences, rest = split_sentences(text)
    assert len(sentences) == 1 and len(sentences[0]) <= MAX_SENTENCE_CHARS and sentences[0].startswith("word")
    assert len(rest) <= MAX_SENTENCE_CHARS
    assert " ".join([*sentences, rest]).split() == text.split()


def test_growing_text_gives_the_same_sentences_as_the_whole() -> None:
    answer = "It is sunny. Bring a hat! Or not? Your call.\nBye."
    spoken, pending = [], ""
    for piece in [answer[i:i + 3] for i in range(0, len(answer), 3)]:
        ready, pending = split_sentences(pending + piece)
        spoken += ready
    assert [*spoken, pending.strip()] == ["It is sunny.", "Bring a hat!", "Or not?", "Your call.", "Bye."]
