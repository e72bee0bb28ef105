"""Topics and planes: which typed messages travel where, and with which delivery guarantees.

Every topic is assigned exactly one plane in one table (`TOPICS`), checked by
`validate_topic_table`. The plane decides QoS (see `router.py` for the zenoh mapping) and the
receive-queue policy:

- CONTROL: events, commands, election. Reliable, publisher blocks on congestion, high
  priority; a full receive queue drops the newest and counts it (logged once).
- TELEMETRY: readings that are not decisions. Best effort, dropped under congestion; the
  receive queue keeps the latest value per (sender, key, reading) instead of dropping.
- DATA: generated output and bulk input. Reliable, node-addressed (`.../<topic>/<node>`),
  bounded per subscription with drop-and-count.

This module must never import zenoh: the table is plain data, usable by pure code and
tests. The concrete topic list lands once `skulk.shared.types` has the events and commands;
add entries to `TOPICS` then.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter

from skulk.routing.constants import PRESENCE_SEGMENT, is_valid_id


class Plane(enum.Enum):
    CONTROL = "control"
    TELEMETRY = "telemetry"
    DATA = "data"

    @property
    def reliable(self) -> bool:
        return self is not Plane.TELEMETRY

    @property
    def blocks_on_congestion(self) -> bool:
        """True when a publisher waits for network capacity instead of dropping."""
        return self is not Plane.TELEMETRY

    @property
    def latest_value(self) -> bool:
        """True when a full receive queue replaces older values instead of dropping new ones."""
        return self is Plane.TELEMETRY


# Receive-queue capacities per plane when a subscriber does not choose one. Telemetry follows
# the seed's 256-key admission map; control and data hold a few seconds of a busy cluster.
DEFAULT_QUEUE_CAPACITY: Final[Mapping[Plane, int]] = {
    Plane.CONTROL: 1024,
    Plane.TELEMETRY: 256,
    Plane.DATA: 1024,
}


KIB: Final = 1024
MIB: Final = 1024 * KIB

DEFAULT_MAX_PAYLOAD_BYTES: Final[Mapping[Plane, int]] = {
    Plane.CONTROL: 64 * MIB,
    Plane.TELEMETRY: 1 * MIB,
    Plane.DATA: 256 * MIB,
}
"""Largest payload (before sealing) a topic admits when its entry does not say. Bigger
samples are refused on arrival, before they are copied, decrypted or buffered, and counted
as "oversize". Control carries commands with a whole prompt (the API's body limit, at most
`skulk.shared.body_limits.MAX_MAX_BODY_BYTES`, fits with room for framing); data carries embedding
answers (2048 inputs of 8192 dimensions is ~150 MB of msgpack floats)."""


def default_latest_key(message: Any) -> Hashable:
    """Telemetry readings of different types from one sender never overwrite each other."""
    return type(message).__name__


@dataclass(frozen=True, eq=False)
class Topic:
    """One typed topic. `adapter` may be a pydantic model class or a TypeAdapter (e.g. of a union).

    `latest_key` (telemetry only) names the reading within one sender's stream; values with
    the same (sender, key expression, latest_key) replace each other in a full receive queue.
    `max_payload_bytes` bounds one message (see DEFAULT_MAX_PAYLOAD_BYTES).
    """

    name: str
    plane: Plane
    adapter: TypeAdapter[Any] | type[BaseModel]
    node_addressed: bool = False
    latest_key: Callable[[Any], Hashable] = field(default=default_latest_key)
    max_payload_bytes: int | None = None
    """Largest payload this topic admits; None takes the plane's default."""

    def __post_init__(self) -> None:
        if not isinstance(self.adapter, TypeAdapter):
            object.__setattr__(self, "adapter", TypeAdapter(self.adapter))
        if self.max_payload_bytes is None and isinstance(self.plane, Plane):
            object.__setattr__(self, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES[self.plane])

    @property
    def type_adapter(self) -> TypeAdapter[Any]:
        adapter = self.adapter
        assert isinstance(adapter, TypeAdapter)
        return adapter

    def __repr__(self) -> str:
        suffix = ", node_addressed" if self.node_addressed else ""
        return f"Topic({self.name!r}, {self.plane.name}{suffix})"


class TopicTableError(ValueError):
    """The topic table breaks an invariant; `problems` lists every one found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid topic table: " + "; ".join(problems))
        self.problems = problems


def validate_topic_table(topics: Iterable[Topic]) -> None:
    """Raise TopicTableError unless names are unique key chunks and every topic has a plane.

    Data-plane topics must be node-addressed: bulk output goes to the one node that asked.
    """
    problems: list[str] = []
    seen: set[str] = set()
    for topic in topics:
        if not isinstance(topic, Topic):
            problems.append(f"{topic!r} is not a Topic")
            continue
        if not is_valid_id(topic.name):
            problems.append(f"topic name {topic.name!r} is not a single key-expression chunk")
        if topic.name == PRESENCE_SEGMENT:
            problems.append(f"topic name {topic.name!r} is reserved for presence tokens")
        if not isinstance(topic.max_payload_bytes, int) or topic.max_payload_bytes < 1:
            problems.append(f"topic {topic.name!r} has no payload bound ({topic.max_payload_bytes!r})")
        if topic.name in seen:
            problems.append(f"topic name {topic.name!r} is used twice")
        seen.add(topic.name)
        if not isinstance(topic.plane, Plane):
            problems.append(f"topic {topic.name!r} has no plane ({topic.plane!r})")
        elif topic.plane is Plane.DATA and not topic.node_addressed:
            problems.append(f"data-plane topic {topic.name!r} must be node-addressed")
    if problems:
        raise TopicTableError(problems)


# The cluster's topic table: every topic, its plane and its payload type.
def _telemetry_key(message: Any) -> Hashable:
    """Download progress is keyed per model so one model's progress never hides another's."""
    model_id = getattr(message, "model_id", None)
    return (type(message).__name__, model_id) if model_id is not None else type(message).__name__


def largest_payload_bytes(topics: Iterable[Topic]) -> int:
    """The largest payload any topic admits: zenoh's own reassembly bound is set from it."""
    return max(topic.max_payload_bytes or 0 for topic in topics)


def _build_topics() -> dict[str, Topic]:
    # Imported here so that pure code can use Plane/Topic without loading the whole model.
    from skulk.shared.types.chunks import DATA_FRAME_ADAPTER
    from skulk.shared.types.commands import ForwarderCommand
    from skulk.shared.types.election import ElectionMessage
    from skulk.shared.types.events import LocalEvent
    from skulk.shared.types.providers import PROVIDER_CALL_ADAPTER, ProviderFrame
    from skulk.shared.types.sync import SYNC_REPLY_ADAPTER, GlobalEvent, SyncRequest
    from skulk.shared.types.task_inputs import TaskInputAck, TaskInputChunk
    from skulk.shared.types.telemetry import TELEMETRY_ADAPTER

    table = [
        Topic("global_events", Plane.CONTROL, GlobalEvent),
        Topic("local_events", Plane.CONTROL, LocalEvent),
        Topic("commands", Plane.CONTROL, ForwarderCommand),
        # Election and sync requests are a few ids and numbers: a few KB at most.
        Topic("election", Plane.CONTROL, ElectionMessage, max_payload_bytes=64 * KIB),
        Topic("sync_requests", Plane.CONTROL, SyncRequest, max_payload_bytes=64 * KIB),
        # A whole State snapshot: the largest control message.
        Topic("state_sync", Plane.CONTROL, SYNC_REPLY_ADAPTER, node_addressed=True, max_payload_bytes=256 * MIB),
        Topic("telemetry", Plane.TELEMETRY, TELEMETRY_ADAPTER, latest_key=_telemetry_key),
        Topic("data", Plane.DATA, DATA_FRAME_ADAPTER, node_addressed=True),
        # A request's text, straight to the node that runs it: never through the master. In
        # chunks of at most input_transfer.CHUNK_BYTES (1 MiB, ~1.34 MiB as base64), and one ack
        # per transfer back to the sender (a few ids and a reason).
        Topic("task_inputs", Plane.DATA, TaskInputChunk, node_addressed=True, max_payload_bytes=2 * MIB),
        Topic("task_input_acks", Plane.DATA, TaskInputAck, node_addressed=True, max_payload_bytes=64 * KIB),
        # Capability calls between the caller's node and the provider's node, never through the
        # master: describe, open (admission) and cancel on control; the frames of both
        # directions on data. Both bounds are a call's payload cap plus framing.
        Topic("provider_calls", Plane.CONTROL, PROVIDER_CALL_ADAPTER, node_addressed=True, max_payload_bytes=4 * MIB),
        Topic("provider_data", Plane.DATA, ProviderFrame, node_addressed=True, max_payload_bytes=2 * MIB),
    ]
    validate_topic_table(table)
    return {topic.name: topic for topic in table}


class _Topics:
    """Lazy, attribute-style access to the table: `TOPICS.global_events`."""

    def __init__(self) -> None:
        self._table: dict[str, Topic] | None = None

    def _get(self) -> dict[str, Topic]:
        if self._table is None:
            self._table = _build_topics()
        return self._table

    def __getattr__(self, name: str) -> Topic:
        try:
            return self._get()[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self):
        return iter(self._get().values())


TOPICS = _Topics()
