"""The crash circuit breaker: give up on an instance whose runners keep dying."""

from __future__ import annotations

import pytest

from skulk.shared.types.ids import InstanceId
from skulk.worker.runner.breaker import CRASH_BREAKER_MAX_CRASHES, CrashBreaker

A = InstanceId("inst-a")
B = InstanceId("inst-b")


def breaker_with(crashes: list[tuple[InstanceId, float]], **kwargs) -> CrashBreaker:
    breaker = CrashBreaker(**kwargs)
    for instance_id, at in crashes:
        breaker = breaker.record(instance_id, at)
    return breaker


@pytest.mark.parametrize(
    ("crashes", "now", "give_up"),
    [
        ([], 0.0, False),
        ([(A, 0.0)], 1.0, False),
        ([(A, 0.0), (A, 10.0)], 11.0, False),
        ([(A, 0.0), (A, 10.0), (A, 20.0)], 21.0, True),
        # crashes older than the window are forgiven
        ([(A, 0.0), (A, 10.0), (A, 20.0)], 600.0 + 1.0, False),
        ([(A, 0.0), (A, 500.0), (A, 700.0)], 701.0, False),
        ([(A, 100.0), (A, 500.0), (A, 650.0)], 699.0, True),
        # another instance's crashes never count
        ([(B, 0.0), (B, 1.0), (B, 2.0), (A, 3.0)], 4.0, False),
    ],
)
def test_gives_up_after_max_crashes_within_the_window(crashes, now, give_up) -> None:
    breaker = breaker_with(crashes, max_crashes=3, window_s=600.0)
    assert breaker.should_give_up(A, now) is give_up


def test_record_is_pure_and_prunes_old_crashes() -> None:
    empty = CrashBreaker(max_crashes=2, window_s=10.0)
    once = empty.record(A, 0.0)
    assert empty.crash_count(A, 0.0) == 0
    assert once.crash_count(A, 1.0) == 1
    later = once.record(A, 20.0)
    assert later.crashes[A] == (20.0,)
    assert not later.should_give_up(A, 20.0)
    assert later.record(A, 25.0).should_give_up(A, 25.0)


def test_forget_clears_one_instance() -> None:
    breaker = breaker_with([(A, 0.0), (A, 1.0), (A, 2.0), (B, 0.0), (B, 1.0), (B, 2.0)])
    cleared = breaker.forget(A)
    assert not cleared.should_give_up(A, 3.0)
    assert cleared.should_give_up(B, 3.0)
    assert cleared.forget(A) is cleared


def test_defaults_and_bad_settings() -> None:
    default = CrashBreaker()
    at = 0.0
    for _ in range(CRASH_BREAKER_MAX_CRASHES - 1):
        default = default.record(A, at)
        at += 1
    assert not default.should_give_up(A, at)
    assert default.record(A, at).should_give_up(A, at)
    with pytest.raises(ValueError):
        CrashBreaker(max_crashes=0)
    with pytest.raises(ValueError):
        CrashBreaker(window_s=0)
