"""Prompt-lookup drafting: what is drafted from a context, and how many drafts are kept."""

from __future__ import annotations

import pytest

from skulk.worker.engines.ngram_draft import accepted, propose


@pytest.mark.parametrize(
    ("context", "limit", "expected"),
    [
        ([], 4, []),
        ([1], 4, []),
        ([1, 2, 3, 4], 4, []),  # no earlier occurrence of the tail
        ([1, 2, 3, 9, 1, 2], 4, [3, 9, 1, 2]),  # the 2-gram (1, 2) was followed by 3, 9, 1, 2
        ([1, 2, 3, 9, 1, 2], 2, [3, 9]),
        ([1, 2, 3, 9, 1, 2], 0, []),
        # The longest n-gram wins: (7, 1, 2) matches at 4, (1, 2) alone would match at 0 too.
        ([1, 2, 5, 7, 1, 2, 6, 8, 7, 1, 2], 4, [6, 8, 7, 1]),
        # The most recent occurrence wins among equal lengths.
        ([4, 5, 1, 6, 4, 5, 2, 6, 4, 5], 1, [2]),
        # A repeating token: its own run is the draft.
        ([3, 3, 3, 3], 4, [3]),
        ([9, 3, 3, 3, 3], 4, [3]),
    ],
)
def test_propose(context, limit, expected):
    assert propose(context, limit) == expected


def test_the_lookback_bounds_the_search():
    context = [1, 2, 3] + [0] * 20 + [1, 2]
    assert propose(context, 1) == [3]
    assert propose(context, 1, lookback=10) == []


@pytest.mark.parametrize(
    ("drafts", "sampled", "kept"),
    [
        ([], [5], 0),
        ([1, 2, 3], [1, 2, 3, 4], 3),  # all kept, and the next token besides
        ([1, 2, 3], [1, 7, 3, 4], 1),  # the target disagreed at the second: the rest is void
        ([1, 2, 3], [9, 2, 3, 4], 0),
    ],
)
def test_accepted(drafts, sampled, kept):
    assert accepted(drafts, sampled) == kept


def test_accepted_needs_one_more_sampled_token_than_drafts():
    with pytest.raises(ValueError, match="expected one more"):
        accepted([1, 2], [1, 2])
