"""The decisions the worker's shell (`skulk.worker.main.Worker`) acts on, as pure functions.

The shell owns time, the router and the runner processes; what it does with what it hears
is decided here, over plain values, so each rule has a table test
(tests/worker/test_shell_rules.py) and the shell only moves data:

- `task_status_of`: a runner's report that a task ended -> the task status the cluster sees.
- `status_to_report`: a runner's status -> the status published (a runner that served and
  then failed still says it served, so the master treats its loss as a serving failure).
- `refusal_wait_s` / `refuse_again`: after asking the master to re-place an instance this
  node refused, how long to wait before asking again, and whether to (only while the
  instance still exists: the master ignores a refusal of an instance it already repaired).

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from types import MappingProxyType

from skulk.shared.types.chunks import StreamOutcome
from skulk.shared.types.common import TaskStatus
from skulk.shared.types.instances import RunnerStatus

REFUSAL_RETRY_S = 1.0
"""Pause before re-sending a RefuseInstancePlacement that could not be published (no master
reachable): bounds the retry rate while the cluster elects one."""
REFUSAL_RESEND_S = 10.0
"""How long a published refusal may go unanswered (its instance still in State) before it is
sent again: the master acts on one within a plan tick, so this only fires when it was lost."""

TASK_STATUS_OF_OUTCOME: Mapping[StreamOutcome, TaskStatus] = MappingProxyType({
    "completed": "Complete", "failed": "Failed", "cancelled": "Cancelled",
})
"""How a task a runner finished ends in State."""


def task_status_of(outcome: StreamOutcome) -> TaskStatus:
    """The task status for a runner's `TaskDone` outcome."""
    return TASK_STATUS_OF_OUTCOME[outcome]


def status_to_report(status: RunnerStatus, served_before: bool) -> RunnerStatus:
    """The runner status to publish: a failure of a runner that had served says so."""
    if status.state == "Failed" and served_before and not status.served:
        return status.model_copy(update={"served": True})
    return status


def refusal_wait_s(published: bool) -> float:
    """How long to wait before a refusal may be sent again: a published one gets a plan
    tick's worth and more to be acted on, an unpublished one is retried soon."""
    return REFUSAL_RESEND_S if published else REFUSAL_RETRY_S


def refuse_again(instance_id: str, instances: Container[str]) -> bool:
    """Whether, once the wait is over, the refusal should be made anew: the instance is
    still in State, so the master has not re-placed it yet."""
    return instance_id in instances


__all__ = [
    "REFUSAL_RESEND_S",
    "REFUSAL_RETRY_S",
    "TASK_STATUS_OF_OUTCOME",
    "refusal_wait_s",
    "refuse_again",
    "status_to_report",
    "task_status_of",
]
