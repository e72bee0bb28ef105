"""The worker shell's decisions (skulk.worker.shell_rules), one table each."""

from __future__ import annotations

import pytest

from skulk.shared.types.common import RunnerState
from skulk.shared.types.ids import InstanceId, NodeId, RunnerId
from skulk.shared.types.instances import RunnerStatus
from skulk.shared.types.state import State
from skulk.worker.plan import LocalRunner, WorkerView
from skulk.worker.shell_rules import (
    IDLE_PASS_INTERVAL_S,
    PASS_INTERVAL_S,
    REFUSAL_RESEND_S,
    REFUSAL_RETRY_S,
    pass_wait_s,
    refusal_wait_s,
    refuse_again,
    settled,
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


def worker_view(*runner_states: RunnerState, **fields) -> WorkerView:
    runners = {RunnerId(f"r{i}"): LocalRunner(runner_id=RunnerId(f"r{i}"), instance_id=InstanceId("i1"),
                                              status=RunnerStatus(state=state))
               for i, state in enumerate(runner_states)}
    return WorkerView(node_id=NodeId("me"), state=State(), cards={}, runners=runners, **fields)


@pytest.mark.parametrize(("name", "view", "expected"), [
    ("no runners, nothing going on", worker_view(), True),
    ("a ready runner", worker_view("Ready"), True),
    ("runners at rest, one failed", worker_view("Ready", "Failed", "Shutdown"), True),
    ("a runner loading", worker_view("Ready", "Loading"), False),
    ("a runner warming up", worker_view("WarmingUp"), False),
    ("a runner serving", worker_view("Running"), False),
    ("a runner stopping", worker_view("ShuttingDown"), False),
    ("a model being resolved", worker_view(resolving=frozenset({"m"})), False),
    ("a task on a runner", worker_view("Ready", dispatched=frozenset({"t1"})), False),
    ("a task input waiting for its task", worker_view("Ready", task_inputs=frozenset({"c1"})), True),
])
def test_settled(name, view, expected):
    assert settled(view) is expected, name


@pytest.mark.parametrize(("name", "view", "retry_at", "now", "wait_s"), [
    ("settled: the slow backstop", worker_view("Ready"), [], 100.0, IDLE_PASS_INTERVAL_S),
    ("in motion: the quick pass", worker_view("Loading"), [], 100.0, PASS_INTERVAL_S),
    ("in motion, whatever the retries", worker_view("Loading"), [101.0], 100.0, PASS_INTERVAL_S),
    ("settled, a retry due sooner", worker_view("Ready"), [None, 102.0, 104.0], 100.0, 2.0),
    ("settled, a retry due later", worker_view("Ready"), [100.0 + 2 * IDLE_PASS_INTERVAL_S], 100.0,
     IDLE_PASS_INTERVAL_S),
    ("settled, a retry due now: no busy loop", worker_view("Ready"), [100.01], 100.0, PASS_INTERVAL_S),
    ("settled, a retry overdue", worker_view("Ready"), [90.0], 100.0, PASS_INTERVAL_S),
    ("settled, a failure with no retry time", worker_view("Ready"), [None], 100.0, IDLE_PASS_INTERVAL_S),
])
def test_pass_wait_s(name, view, retry_at, now, wait_s):
    assert pass_wait_s(view, retry_at, now) == pytest.approx(wait_s), name
