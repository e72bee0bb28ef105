"""The incremental <think> splitter: any way the text is cut into pieces, the released
reasoning and content are the same, and text is held only while it may be a tag."""

from __future__ import annotations

import pytest

from skulk.api.reasoning import ReasoningSplitter


def run(pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter()
    out = [p for piece in pieces for p in splitter.push(piece)] + splitter.flush()
    return "".join(t for t, r in out if r), "".join(t for t, r in out if not r)


CASES = [
    # (full text, reasoning, content)
    ("<think>Let me see.</think>\n\nParis.", "Let me see.", "Paris."),
    ("  <think>\nhmm\n</think>The answer", "\nhmm\n", "The answer"),
    ("Just an answer.", "", "Just an answer."),
    ("An answer that mentions <think> later.", "", "An answer that mentions <think> later."),
    ("<think>never closed", "never closed", ""),
    ("<thi", "", "<thi"),
    ("<think></think>Answer", "", "Answer"),
    ("<think>a < b </thinking> still</think>x", "a < b </thinking> still", "x"),
    ("", "", ""),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_whole_text(text, reasoning, content):
    assert run([text]) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_one_character_at_a_time(text, reasoning, content):
    assert run(list(text)) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_every_two_way_cut(text, reasoning, content):
    for cut in range(len(text) + 1):
        assert run([text[:cut], text[cut:]]) == (reasoning, content), cut


@pytest.mark.parametrize(
    ("pieces", "released"),
    [
        # prose is released at once, not held to the end
        (["Hello", " world"], [[("Hello", False)], [(" world", False)]]),
        # a possible tag is held until it is decided
        (["<th", "ink>why", "</thi", "nk>ok"], [[], [("why", True)], [], [("ok", False)]]),
        (["<th", "ere"], [[], [("<there", False)]]),
    ],
)
def test_holds_only_what_may_be_a_tag(pieces, released):
    splitter = ReasoningSplitter()
    assert [splitter.push(p) for p in pieces] == released


def test_settles_once_the_answer_has_begun():
    splitter = ReasoningSplitter()
    splitter.push("<think>x</think>")
    assert not splitter.settled
    splitter.push("\n\nAnswer")
    assert splitter.settled
    assert ReasoningSplitter().push("plain") == [("plain", False)]
