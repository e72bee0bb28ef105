"""State-sync messages: how a follower catches up with the master.

A follower asks (`SyncRequest`); the master answers on the node-addressed STATE_SYNC topic
with the latest State snapshot it holds (`SnapshotOffer`) and then the retained tail of
indexed events after it, in paced bursts (`EventBurst`). Every answer names the master's
session so a follower never mixes two sessions' histories.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from skulk.shared.types.base import WireModel
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.ids import NodeId, SessionId
from skulk.shared.types.state import State


class SyncRequest(WireModel):
    """From a follower to the master: send me everything from `since_idx` on.

    `want_snapshot` asks for a State snapshot first (a node that just joined, or one that
    adopted a new master session and must drop whatever the old session left it)."""

    type: Literal["SyncRequest"] = "SyncRequest"
    node_id: NodeId
    session_id: SessionId
    since_idx: int = Field(ge=0)
    want_snapshot: bool = False


class SnapshotOffer(WireModel):
    type: Literal["SnapshotOffer"] = "SnapshotOffer"
    session_id: SessionId
    high_water_idx: int = Field(ge=-1)
    state: State


class EventBurst(WireModel):
    type: Literal["EventBurst"] = "EventBurst"
    session_id: SessionId
    events: list[IndexedEvent]


SyncReply = Annotated[SnapshotOffer | EventBurst, Field(discriminator="type")]
SYNC_REPLY_ADAPTER: TypeAdapter[SyncReply] = TypeAdapter(SyncReply)


class GlobalEvent(WireModel):
    """An indexed event as the master broadcasts it, stamped with the master's session."""

    type: Literal["GlobalEvent"] = "GlobalEvent"
    session_id: SessionId
    event: IndexedEvent
