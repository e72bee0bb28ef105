"""The staged-copy eviction planner: recency budget, disk safety, protected copies."""

from __future__ import annotations

import pytest

from skulk.model_store.eviction import GIB, EvictionPolicy, StagedCopy, plan_eviction


def copy(key: str, gib: float, last_used: float, *, in_use: bool = False, canonical: bool = False) -> StagedCopy:
    return StagedCopy(key=key, size_bytes=int(gib * GIB), last_used_s=last_used, in_use=in_use, canonical=canonical)


POLICY = EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=40 * GIB, reserve_bytes=10 * GIB)
NO_CLEANUP = EvictionPolicy(cleanup_on_deactivate=False, keep_recent_bytes=40 * GIB, reserve_bytes=10 * GIB)
PLENTY = 1000 * GIB


@pytest.mark.parametrize(
    ("name", "copies", "policy", "free_gib", "pending_gib", "evict", "fits"),
    [
        ("nothing staged", [], POLICY, 1000, None, (), True),
        ("within budget keeps everything", [copy("a", 10, 1), copy("b", 20, 2)], POLICY, 1000, None, (), True),
        ("exactly the budget is kept", [copy("a", 20, 1), copy("b", 20, 2)], POLICY, 1000, None, (), True),
        ("oldest beyond budget goes", [copy("a", 30, 1), copy("b", 30, 2)], POLICY, 1000, None, ("a",), True),
        (
            "strict recency cut: an old small copy behind the cut goes too",
            [copy("old-small", 1, 1), copy("mid", 30, 2), copy("new", 30, 3)], POLICY, 1000, None,
            ("old-small", "mid"), True,
        ),
        (
            "in-use copies are kept and do not count against the budget",
            [copy("live", 100, 0, in_use=True), copy("a", 20, 1), copy("b", 20, 2)], POLICY, 1000, None, (), True,
        ),
        (
            "the canonical copy is never a candidate",
            [copy("store", 500, 0, canonical=True), copy("a", 10, 1)], POLICY, 1000, None, (), True,
        ),
        (
            "no cleanup on deactivate: the budget pass is off",
            [copy("a", 30, 1), copy("b", 30, 2)], NO_CLEANUP, 1000, None, (), True,
        ),
        ("allocation fits without eviction", [copy("a", 10, 1)], POLICY, 100, 50, (), True),
        (
            "disk safety evicts least recently used until the allocation plus reserve fits",
            [copy("a", 10, 1), copy("b", 10, 2), copy("c", 10, 3)], POLICY, 45, 50, ("a", "b"), True,
        ),
        (
            "disk safety overrides the budget even when cleanup is off",
            [copy("a", 10, 1), copy("b", 10, 2)], NO_CLEANUP, 55, 50, ("a",), True,
        ),
        (
            "the reserve counts: free == pending is not enough",
            [copy("a", 10, 1)], POLICY, 50, 50, ("a",), True,
        ),
        (
            "live and canonical copies are never evicted for space",
            [copy("live", 100, 0, in_use=True), copy("store", 100, 0, canonical=True), copy("a", 5, 1)],
            POLICY, 10, 50, (), False,
        ),
        (
            "cannot fit: nothing beyond the budget pass is deleted",
            [copy("a", 30, 1), copy("b", 30, 2), copy("c", 5, 3)], POLICY, 0, 500, ("a",), False,
        ),
        (
            "budget pass and safety pass combine",
            [copy("a", 30, 1), copy("b", 30, 2), copy("c", 5, 3)], POLICY, 10, 50, ("a", "b"), True,
        ),
        ("a zero-byte allocation still needs the reserve", [copy("a", 10, 1)], POLICY, 5, 0, ("a",), True),
    ],
)
def test_plan_eviction(name, copies, policy, free_gib, pending_gib, evict, fits):
    pending = None if pending_gib is None else int(pending_gib * GIB)
    plan = plan_eviction(copies, policy, int(free_gib * GIB), pending)
    assert (plan.evict, plan.fits) == (evict, fits), name


def test_plan_reports_the_arithmetic():
    plan = plan_eviction([copy("a", 10, 1), copy("b", 10, 2)], POLICY, 5 * GIB, 50 * GIB)
    assert not plan.fits
    assert plan.needed_bytes == 60 * GIB
    assert plan.available_bytes == 5 * GIB
    assert plan.shortfall_bytes == 55 * GIB


def test_hardlinked_copies_free_nothing_so_safety_keeps_going():
    # A copy hardlinked to the store frees 0 bytes: deleting it cannot help, so the planner
    # moves on to a copy that does free space.
    copies = [copy("linked", 0, 1), copy("real", 20, 2)]
    plan = plan_eviction(copies, NO_CLEANUP, 5 * GIB, 10 * GIB)
    assert plan.fits and plan.evict == ("real",)


def test_ties_in_last_use_are_deterministic():
    copies = [copy("b", 30, 1), copy("a", 30, 1)]
    assert plan_eviction(copies, POLICY, PLENTY).evict == plan_eviction(list(reversed(copies)), POLICY, PLENTY).evict


def test_policy_from_config_gb():
    policy = EvictionPolicy.from_gb(False, 12.5, 2)
    assert policy == EvictionPolicy(False, int(12.5 * GIB), 2 * GIB)
