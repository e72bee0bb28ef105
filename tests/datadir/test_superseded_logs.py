"""Superseded event logs are kept within a count and an age, pruned at start and at each supersede."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.datadir.config import EventLogSection, parse_config
from skulk.datadir.superseded_logs import Retention, retention_from, to_prune
from skulk.master.main import EventLogSlot

DAY = 86400.0
NOW = 1_000 * DAY


def _name(days_ago: float) -> str:
    return f"event_log.superseded-{int(NOW - days_ago * DAY)}"


@pytest.mark.parametrize(
    ("ages_days", "retention", "pruned_ages"),
    [
        ([], Retention(3, None), []),
        ([1, 2, 3], Retention(3, None), []),
        ([1, 2, 3, 4, 5], Retention(3, None), [4, 5]),  # the oldest beyond the count
        ([1, 2, 3], Retention(0, None), [1, 2, 3]),  # keep none
        ([1, 20, 30], Retention(3, 14 * DAY), [20, 30]),  # too old even within the count
        ([1, 2], Retention(3, 14 * DAY), []),
    ],
)
def test_to_prune(ages_days: list[float], retention: Retention, pruned_ages: list[float]) -> None:
    assert to_prune([_name(a) for a in ages_days], retention, NOW) == sorted(_name(a) for a in pruned_ages)


def test_names_without_a_stamp_are_never_pruned() -> None:
    assert to_prune(["event_log.superseded-notanumber", "event_log"], Retention(0, None), NOW) == []


def test_the_config_section_is_strict_and_0_days_means_no_age_limit(tmp_path: Path) -> None:
    section = parse_config("event_log:\n  superseded_keep: 1\n  superseded_max_age_days: 0\n", tmp_path / "c").event_log
    assert retention_from(section) == Retention(keep=1, max_age_s=None)
    assert retention_from(EventLogSection()) == Retention(keep=3, max_age_s=14 * DAY)
    with pytest.raises(ValueError, match="superseded_kept"):
        parse_config("event_log:\n  superseded_kept: 1\n", tmp_path / "c")


def test_the_slot_prunes_at_open_and_at_each_supersede(tmp_path: Path) -> None:
    live = tmp_path / "event_log"
    for stamp in (100, 200, 300):
        (tmp_path / f"event_log.superseded-{stamp}").mkdir()
        (tmp_path / f"event_log.superseded-{stamp}" / "events.log").write_bytes(b"x")
    slot = EventLogSlot(live, retention=Retention(keep=2, max_age_s=None))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "event_log", "event_log.superseded-200", "event_log.superseded-300"]
    slot.supersede()  # the live log moves aside with a current stamp; the oldest goes
    slot.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "event_log" in names and "event_log.superseded-300" in names and "event_log.superseded-200" not in names
    assert len([n for n in names if ".superseded-" in n]) == 2
