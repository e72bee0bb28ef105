"""A request's text, kept out of the cluster's State and event log.

The master needs a task's metadata (which model, which instance, how many tokens, who owns
the stream), never its text: prompts and outputs must not be written into the master's
event log or shown by `/state`. So the API node submits `GenerateText`/`RunWorkload` with
*redacted* params (each params model's `redacted()`: every piece
of caller text emptied, the shape kept), and sends the full params as a `TaskInput` over the
data plane to the node that runs the task's rank 0, once the master has bound the task to
an instance (`skulk.cluster.task_inputs`). The worker dispatches a task only when its input
has arrived (`skulk.worker.plan.dispatch_pending_tasks`).
"""

from __future__ import annotations

from skulk.shared.types.base import WireModel
from skulk.shared.types.ids import CommandId
from skulk.shared.types.tasks import WorkloadParams


class TaskInput(WireModel):
    """The full params of one command, addressed to the node that runs it: any workload's,
    told apart by `params.workload`."""

    command_id: CommandId
    params: WorkloadParams


__all__ = ["TaskInput"]
