"""The pure prefix-cache policy: which cached prefix a prompt starts from, what is saved,
what the cold store evicts."""

from __future__ import annotations

import pytest

from skulk.shared.prefix_cache import (
    COLD_BUDGET_ENV,
    DEFAULT_COLD_BUDGET_BYTES,
    CachedPrefix,
    PrefixChoice,
    admit,
    choose_prefix,
    cold_budget_bytes,
    common_prefix,
    touch,
)

A = tuple(range(100, 140))  # conversation A's history (40 tokens)
B = tuple(range(200, 240))  # conversation B's history


def entry(key: int, tokens: tuple[int, ...], size: int = 10, used: int = 0) -> CachedPrefix:
    return CachedPrefix(key, tokens, size, used)


@pytest.mark.parametrize(
    "prompt, hot, cold, expected",
    [
        # nothing cached anywhere
        ((*A, 1), (), (), PrefixChoice("none", 0, False)),
        # the hot sequence is this conversation: extend it, nothing to save
        ((*A, 1, 2), A, (), PrefixChoice("hot", 40, False)),
        # exactly the hot sequence again: the last prompt token is always evaluated
        (A, A, (), PrefixChoice("hot", 39, False)),
        # another conversation arrives: the hot one is saved before being overwritten
        ((*B, 1), A, (), PrefixChoice("none", 0, True)),
        # ...and A's next turn finds A in the cold store, saving B first
        ((*A, 1, 2), B, (entry(7, A),), PrefixChoice("cold", 40, True, 7)),
        # B is already in the cold store in full: saving it again adds nothing
        ((*A, 1, 2), B, (entry(7, A), entry(8, B)), PrefixChoice("cold", 40, False, 7)),
        # a cold entry only slightly longer than the hot match is not worth a restore
        ((*A[:35], 9, 9), A[:30], (entry(7, A),), PrefixChoice("hot", 30, False)),
        # the longest cold match wins over a shorter one
        ((*A, 1), (), (entry(1, A[:20]), entry(2, A)), PrefixChoice("cold", 40, False, 2)),
        # among equal matches the most recently used wins
        ((*A[:20], 5), (), (entry(1, (*A[:20], 3), used=1), entry(2, (*A[:20], 4), used=5)),
         PrefixChoice("cold", 20, False, 2)),
        # a short hot sequence is not worth saving
        ((*B, 1), A[:5], (), PrefixChoice("none", 0, False)),
    ],
)
def test_choose_prefix(prompt, hot, cold, expected) -> None:
    assert choose_prefix(prompt, hot, cold) == expected


@pytest.mark.parametrize(
    "entries, new, budget, kept, evicted, admitted",
    [
        # room for everything
        ((entry(1, A, 10),), entry(2, B, 10), 100, (1, 2), (), True),
        # the new entry extends an old one: the old one is superseded
        ((entry(1, A[:20], 10),), entry(2, A, 10), 100, (2,), (1,), True),
        # over budget: least recently used goes first
        ((entry(1, A, 40, used=5), entry(3, (1, 2), 40, used=1)), entry(2, B, 40, used=9), 90, (1, 2), (3,), True),
        # bigger than the whole budget: not admitted, nothing evicted
        ((entry(1, A, 10),), entry(2, B, 101), 100, (1,), (), False),
        # zero budget admits nothing
        ((), entry(2, B, 1), 0, (), (), False),
    ],
)
def test_admit(entries, new, budget, kept, evicted, admitted) -> None:
    result = admit(entries, new, budget)
    assert tuple(e.key for e in result.kept) == kept
    assert result.evicted == evicted
    assert result.admitted is admitted
    assert sum(e.size_bytes for e in result.kept) <= max(budget, sum(e.size_bytes for e in entries))


def test_common_prefix_and_touch() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    touched = touch((entry(1, A, used=1), entry(2, B, used=1)), 2, 9)
    assert [e.last_used for e in touched] == [1, 9]


@pytest.mark.parametrize(
    "planned, env, expected",
    [
        (None, {}, DEFAULT_COLD_BUDGET_BYTES),
        (5000, {}, 5000),
        (5000, {COLD_BUDGET_ENV: "2"}, 2 * 1024 * 1024),
        (None, {COLD_BUDGET_ENV: "0"}, 0),
    ],
)
def test_cold_budget(planned, env, expected) -> None:
    assert cold_budget_bytes(planned, env) == expected


@pytest.mark.parametrize("raw", ["lots", "-1"])
def test_malformed_cold_budget_is_refused(raw) -> None:
    with pytest.raises(ValueError, match=COLD_BUDGET_ENV):
        cold_budget_bytes(None, {COLD_BUDGET_ENV: raw})
