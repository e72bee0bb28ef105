"""Engine-agnostic streaming text: UTF-8 reassembly across tokens and stop strings."""

from __future__ import annotations

import pytest

from skulk.worker.engines.base import StopStringFilter, Utf8StreamDecoder


def test_a_character_split_across_tokens_is_released_whole() -> None:
    decoder = Utf8StreamDecoder()
    euro = "€".encode()  # 3 bytes
    assert decoder.decode(b"a" + euro[:1]) == "a"
    assert decoder.pending_bytes == 1
    assert decoder.decode(euro[1:2]) == ""
    assert decoder.decode(euro[2:] + b"b") == "€b"
    assert decoder.pending_bytes == 0


def test_four_byte_characters_and_invalid_bytes() -> None:
    decoder = Utf8StreamDecoder()
    smile = "🙂".encode()
    pieces = [decoder.decode(bytes([b])) for b in smile]
    assert pieces == ["", "", "", "🙂"]
    assert decoder.decode(b"\xff") == "\ufffd"  # never a character: replaced, not held


@pytest.mark.parametrize(
    ("stops", "pieces", "released", "matched"),
    [
        ([], ["ab", "c"], ["ab", "c"], False),
        (["END"], ["hello E", "N", "D more"], ["hello ", "", ""], True),
        (["END"], ["hello E", "x"], ["hello ", "Ex"], False),  # a false start is released
        (["\n\n"], ["a\n", "\nb"], ["a", ""], True),
        (["bc", "ab"], ["xabc"], ["x"], True),  # earliest match wins
        (["stop"], ["nonstop"], ["non"], True),
        (["aab"], ["aa", "aab"], ["", "aa"], True),  # overlapping partials
        (["x"], ["", "ax"], ["", "a"], True),
    ],
)
def test_stop_strings_are_trimmed_and_never_leak(stops, pieces, released, matched) -> None:
    stop_filter = StopStringFilter(stops)
    out = []
    hit = False
    for piece in pieces:
        text, hit = stop_filter.push(piece)
        out.append(text)
        if hit:
            break
    assert out == released
    assert hit is matched


def test_held_text_is_released_by_flush_unless_a_stop_matched() -> None:
    pending = StopStringFilter(["</s>"])
    assert pending.push("answer </") == ("answer ", False)
    assert pending.flush() == "</"
    done = StopStringFilter(["</s>"])
    done.push("x</s>y")
    assert done.flush() == ""
    assert done.push("more") == ("", True)
