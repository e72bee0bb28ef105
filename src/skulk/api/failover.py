"""Which of this API's open streams a change of master ends, and why.

A new master seeds its session from its own replica, so a task it already knows keeps
running: the runner's frames come over the data plane, not through the master. A change of
master therefore ends only the streams it really affects (the issue this fixes: a node
returning from a pause used to fail every stream in the cluster, one 1424 tokens in):

- the stream's task is not in this node's State: its command may have been lost with the
  old master, and nothing else would ever end the stream before its first-frame deadline;
- its task's instance is gone, or has a shard on a node whose presence is gone (the old
  master that died, say): its runner cannot finish it.

Every other stream continues to its end. Pure: State and sets in, a mapping out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from skulk.shared.types.state import State


def failover_failures(
    state: State, open_commands: Iterable[str], alive: frozenset[str], session_id: str
) -> dict[str, str]:
    """command id -> the message its stream ends with, for each stream the change of master
    to `session_id` affects (see the module notes); streams not listed continue."""
    tasks_by_command: Mapping[str, object] = {
        command: task for task in state.tasks.values() if (command := getattr(task, "command_id", None))
    }
    failures: dict[str, str] = {}
    for command in open_commands:
        task = tasks_by_command.get(command)
        if task is None:
            failures[command] = (f"the master changed (new session {session_id}) before this request reached "
                                 f"the cluster's log; retry")
            continue
        instance = state.instances.get(task.instance_id)  # type: ignore[attr-defined]
        if instance is None:
            failures[command] = f"the master changed (new session {session_id}) and this request's instance is gone; retry"
            continue
        gone = sorted(n for n in instance.node_ids() if n not in alive)
        if gone:
            failures[command] = (f"the master changed (new session {session_id}) and node {', '.join(gone)} serving "
                                 f"this request is gone; retry")
    return failures


__all__ = ["failover_failures"]
