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
- `pass_wait_s`: how long the shell may wait for a wake-up before its next planning pass
  (short while anything is in motion, long once the node is settled).

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from types import MappingProxyType

from skulk.shared.types.chunks import StreamOutcome
from skulk.shared.types.common import RunnerState, TaskStatus
from skulk.shared.types.instances import RunnerStatus
from skulk.worker.plan import WorkerView

PASS_INTERVAL_S = 0.25
"""The longest the worker goes without a planning pass while anything is in motion on this
node (a model being resolved, a task on a runner, a runner starting or stopping)."""
IDLE_PASS_INTERVAL_S = 5.0
"""The longest a settled worker goes without a planning pass. Every input the plan reads
wakes the shell at once (an applied event, a replica sync, a runner's report, a task's
input, a resolved artifact), so the timed pass is only a backstop for what the clock alone
changes (task inputs' TTL; an artifact failure's retry time is waited for exactly). Passing
every PASS_INTERVAL_S when nothing moved cost an idle node 4 wake-ups a second."""
RESTING_RUNNER_STATES: frozenset[RunnerState] = frozenset({"Ready", "Failed", "Shutdown"})
"""Runner states that change only by a report (which wakes the shell): nothing to watch."""

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


def settled(view: WorkerView) -> bool:
    """Nothing in motion on this node: no model being resolved, no task on a runner (or
    awaiting State's word that it ended), and every local runner at rest."""
    return (not view.resolving and not view.dispatched
            and all(runner.status.state in RESTING_RUNNER_STATES for runner in view.runners.values()))


def pass_wait_s(view: WorkerView, retry_at: Iterable[float | None], now: float) -> float:
    """How long the shell may wait for a wake-up before planning again: PASS_INTERVAL_S
    while anything moves, else until the next artifact failure's retry time (`retry_at`,
    when it is sooner), at most IDLE_PASS_INTERVAL_S and never less than PASS_INTERVAL_S."""
    if not settled(view):
        return PASS_INTERVAL_S
    due_in_s = [at - now for at in retry_at if at is not None]
    return max(PASS_INTERVAL_S, min([IDLE_PASS_INTERVAL_S, *due_in_s]))


__all__ = [
    "IDLE_PASS_INTERVAL_S",
    "PASS_INTERVAL_S",
    "REFUSAL_RESEND_S",
    "REFUSAL_RETRY_S",
    "RESTING_RUNNER_STATES",
    "TASK_STATUS_OF_OUTCOME",
    "pass_wait_s",
    "refusal_wait_s",
    "refuse_again",
    "settled",
    "status_to_report",
    "task_status_of",
]
