"""The runner's OpenMP wait policy: a bounded spin unless the operator chose one."""

from __future__ import annotations

import pytest

from skulk.worker.engines.openmp import DEFAULT_SPIN_COUNT, apply_wait_policy, wait_policy_overrides


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {}),
        ({"GOMP_SPINCOUNT": "infinite"}, {}),
        ({"OMP_WAIT_POLICY": ""}, {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}),
        ({"PATH": "/bin"}, {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}),
    ],
)
def test_overrides_only_when_the_operator_chose_nothing(env, expected) -> None:
    assert wait_policy_overrides(env) == expected


def test_apply_sets_the_overrides_in_place() -> None:
    env = {"PATH": "/bin"}
    assert apply_wait_policy(env) == {"GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}
    assert env == {"PATH": "/bin", "GOMP_SPINCOUNT": str(DEFAULT_SPIN_COUNT)}
    assert apply_wait_policy(env) == {}
