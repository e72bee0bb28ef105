"""Identifier types for everything the cluster names.

Ids are opaque strings on the wire; the `NewType`s only keep a node id from being passed
where an instance id is expected. Ids are minted only in the async shells (API, master,
worker) with `new_id()`, never inside `apply()` or any other pure decision: a reducer that
minted ids would give every replaying node a different state.
"""

from __future__ import annotations

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
TaskId = NewType("TaskId", str)
CommandId = NewType("CommandId", str)
ModelId = NewType("ModelId", str)
SessionId = NewType("SessionId", str)
EventId = NewType("EventId", str)
DownloadAttemptId = NewType("DownloadAttemptId", str)


def new_id() -> str:
    """A fresh random id (uuid4 hex). Shell code only: wrap it in the NewType it names."""
    return uuid.uuid4().hex


__all__ = [
    "CommandId",
    "DownloadAttemptId",
    "EventId",
    "InstanceId",
    "ModelId",
    "NodeId",
    "RunnerId",
    "SessionId",
    "TaskId",
    "new_id",
]
