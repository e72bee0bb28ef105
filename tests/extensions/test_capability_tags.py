"""The node-local capability tag set: well-formed, bounded, idempotent."""

from __future__ import annotations

import pytest

from skulk.extensions.capability_tags import MAX_TAGS, CapabilityTagError, CapabilityTags, checked_tag, with_tag


@pytest.mark.parametrize("tag", ["rag", "stt@1.0.0", "a", "audit.log-v2", "x" * 64, "9lives"])
def test_good_tags(tag: str) -> None:
    assert checked_tag(tag) == tag


@pytest.mark.parametrize("tag", ["", "Rag", "-lead", ".lead", "has space", "x" * 65, "a/b", "é", 7, None])
def test_bad_tags_raise_a_value_error(tag: object) -> None:
    with pytest.raises(ValueError, match="capability tag"):
        checked_tag(tag)


def test_the_set_is_bounded_and_idempotent() -> None:
    tags = frozenset(f"t{i}" for i in range(MAX_TAGS))
    assert with_tag(tags, "t0") is tags  # already there: no bound hit
    with pytest.raises(CapabilityTagError, match="withdraw one"):
        with_tag(tags, "one-more")


def test_advertise_and_withdraw_publish_a_sorted_list() -> None:
    tags = CapabilityTags()
    tags.advertise("zeta")
    tags.advertise("alpha")
    tags.advertise("alpha")
    assert tags.published() == ["alpha", "zeta"]
    tags.withdraw("zeta")
    tags.withdraw("never-there")
    assert tags.published() == ["alpha"]
