"""The worker shell's decisions (skulk.worker.shell_rules), one table each."""

from __future__ import annotations

import pytest

from skulk.shared.types.instances import RunnerStatus
from skulk.worker.shell_rules import (
    REFUSAL_RESEND_S,
    REFUSAL_RETRY_S,
    refusal_wait_s,
    refuse_again,
    status_to_report,
    task_status_of,
)


@pytest.mark.parametrize(("outcome", "status"), [
    ("completed", "Complete"), ("failed", "Failed"), ("cancelled", "Cancelled"),
])
def test_task_status_of(outcome, status):
    assert task_status_of(outcome) == status


def test_every_outcome_has_a_status():
    from typing import get_args

    from skulk.shared.types.chunks import StreamOutcome

    assert {task_status_of(outcome) for outcome in get_args(StreamOutcome)} == {"Complete", "Failed", "Cancelled"}


@pytest.mark.parametrize(("state", "served", "served_before", "reported_served"), [
    ("Failed", False, True, True),     # it served, then failed: the loss is a serving failure
    ("Failed", False, False, False),   # failed while loading: never served
    ("Failed", True, False, True),     # the runner said so itself
    ("Ready", False, True, False),     # only a failure carries the history
])
def test_status_to_report(state, served, served_before, reported_served):
    status = RunnerStatus(state=state, served=served)
    assert status_to_report(status, served_before).served is reported_served


@pytest.mark.parametrize(("published", "wait_s"), [(True, REFUSAL_RESEND_S), (False, REFUSAL_RETRY_S)])
def test_refusal_wait_s(published, wait_s):
    assert refusal_wait_s(published) == wait_s
    assert REFUSAL_RETRY_S < REFUSAL_RESEND_S  # an unpublished refusal is retried sooner


@pytest.mark.parametrize(("instances", "again"), [({"i1", "i2"}, True), ({"i2"}, False), (set(), False)])
def test_refuse_again(instances, again):
    assert refuse_again("i1", instances) is again
