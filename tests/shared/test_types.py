"""Every wire type survives msgpack and JSON, speaks camelCase, and rejects what it must."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, get_args

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.codec import DecodeError, canonical_bytes, pack, round_trip, unpack
from skulk.shared.types.chunks import (
    CHUNK_ADAPTER,
    DATA_FRAME_ADAPTER,
    LOGPROB_FLOOR,
    ErrorChunk,
    ResultChunk,
    StreamPayload,
    StreamStarted,
    StreamTerminal,
    TokenChunk,
    TopLogprob,
)
from skulk.shared.types.commands import (
    COMMAND_ADAPTER,
    AddCustomModelCard,
    CancelCommand,
    CancelDownload,
    CreateInstance,
    DeleteCustomModelCard,
    DeleteInstance,
    EvictStagedModel,
    ForwarderCommand,
    GenerateText,
    PlaceInstance,
    RefuseInstancePlacement,
    RequestEventLog,
    RunWorkload,
    SetTracingEnabled,
    StartDownload,
    TaskFinished,
)
from skulk.shared.types.common import ChatMessage, Edge, NetworkInterface, ToolCall, ToolSpec, Usage
from skulk.shared.types.events import (
    EVENT_ADAPTER,
    CustomModelCardAdded,
    CustomModelCardDeleted,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstancePlacementRefused,
    InstanceRepairAbandoned,
    LocalEvent,
    NodeJoined,
    NodeLeft,
    NodeNetworkUpdated,
    NodeTimedOut,
    RunnerDeleted,
    RunnerStatusUpdated,
    StagedModelEvicted,
    TaskAcknowledged,
    TaskCreated,
    TaskDeleted,
    TaskFailed,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
    TracingStateChanged,
)
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import (
    DOWNLOAD_STATUS_ADAPTER,
    DownloadStatusCompleted,
    DownloadStatusFailed,
    DownloadStatusPending,
    NodeInfo,
    State,
)
from skulk.shared.types.tasks import (
    TASK_ADAPTER,
    EmbeddingParams,
    TextGeneration,
    TextGenerationParams,
    WorkloadTask,
)
from skulk.shared.types.telemetry import (
    TELEMETRY_ADAPTER,
    CapabilityConflict,
    DiskReading,
    DownloadProgress,
    MemoryReading,
    NodeHeartbeat,
    NodeResources,
)
from skulk.shared.types.workload_io import EmbeddingResult

CARD = load_card(builtin_cards_dir() / "local--tiny-llama.toml")

NOW = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
MODEL = "local/tiny-llama"

INSTANCE = Instance(
    instance_id="i1",
    model_id=MODEL,
    sharding="Pipeline",
    shards=[
        ShardAssignment(
            node_id="n1", runner_id="r1", rank=0, world_size=2, start_layer=0, end_layer=4,
            backend="mlx-cpu",
        ),
        ShardAssignment(
            node_id="n2", runner_id="r2", rank=1, world_size=2, start_layer=4, end_layer=8,
            backend="mlx-cpu",
        ),
    ],
    excluded_nodes=["n3"],
    context_token_limit=8192,
    ring_hosts=["10.0.0.1:5000", "10.0.0.2:5000"],
    repair_hop=1,
    created_by_command="c0",
)
CHAT_PARAMS = TextGenerationParams(
    model_id=MODEL,
    messages=[
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Ünïcode ✓ weather?", name="ann"),
        ChatMessage(
            role="assistant",
            tool_calls=[ToolCall(id="call1", name="weather", arguments='{"city":"Oslo"}')],
        ),
        ChatMessage(role="tool", content="-3C", tool_call_id="call1"),
    ],
    max_tokens=16,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    seed=7,
    stop=["\n\n"],
    tools=[
        ToolSpec(
            name="weather",
            description="Current weather",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        )
    ],
    tool_choice={"type": "function", "function": {"name": "weather"}},
    logprobs=True,
    top_logprobs=2,
    stream=True,
)
RAW_PARAMS = TextGenerationParams(model_id=MODEL, prompt="Once upon a time", tool_choice="auto")
EMBED_PARAMS = EmbeddingParams(model_id=MODEL, inputs=["a", "b"], dimensions=64)
TEXT_TASK = TextGeneration(owner_node_id="n1", task_id="t1", instance_id="i1", command_id="c1", params=CHAT_PARAMS)
EDGE = Edge(source="n1", sink="n2", kind="probed", address="10.0.0.2:52415")
USAGE = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
TOKEN = TokenChunk(
    command_id="c1",
    text="Hi",
    token_id=17,
    logprob=-0.25,
    top_logprobs=[TopLogprob(token="Hi", logprob=-0.25, token_id=17), TopLogprob(token="Yo", logprob=-2.0)],
    tool_calls=[ToolCall(id="call2", name="weather", arguments="{}")],
    reasoning=True,
    finish_reason="stop",
    usage=USAGE,
)
RESOURCES = NodeResources(
    node_id="n1",
    node_name="box",
    version="0.1.0",
    memory=MemoryReading(ram_total_bytes=16 << 30, ram_available_bytes=8 << 30),
    disk=DiskReading(models_dir="/data/models", total_bytes=500 << 30, free_bytes=100 << 30),
    backends=["llama_cpp-cpu", "mlx-cpu"],
    capability_conflicts=[
        CapabilityConflict(code="no_gpu", level="warn", message="m", remediation="r")
    ],
    api_endpoint="http://10.0.0.1:52415",
)

EVENTS: list[BaseModel] = [
    NodeJoined(event_id="e1", node_id="n1", node_name="box", version="0.1.0", api_endpoint="http://h:1"),
    NodeLeft(event_id="e2", node_id="n1"),
    NodeTimedOut(
        event_id="e3", node_id="n1", last_event_age_s=40.5, heartbeat_age_s=31.0,
        telemetry_age_s=None, effective_age_s=31.0, timeout_s=30.0,
    ),
    NodeNetworkUpdated(
        event_id="e4",
        node_id="n1",
        interfaces=[
            NetworkInterface(name="en0", addresses=["10.0.0.1", "fe80::1"], kind="ethernet"),
            NetworkInterface(name="tailscale0", addresses=["100.64.0.1"], kind="overlay"),
        ],
    ),
    TopologyEdgeCreated(event_id="e5", edge=EDGE),
    TopologyEdgeDeleted(event_id="e6", edge=Edge(source="n2", sink="n1", kind="session")),
    InstanceCreated(event_id="e7", instance=INSTANCE),
    InstanceDeleted(event_id="e8", instance_id="i1", reason="operator"),
    InstancePlacementRefused(
        event_id="e9", instance_id="i1", node_id="n2", needed_bytes=10, available_bytes=5, message="m"
    ),
    InstanceRepairAbandoned(
        event_id="e9b", model_id=MODEL, instance_id="i1", node_id="n2", repair_hop=2, reason="refused at the last hop"
    ),
    RunnerStatusUpdated(event_id="e10", runner_id="r1", status=RunnerStatus(state="Failed", error_message="boom")),
    RunnerDeleted(event_id="e11", runner_id="r1"),
    TaskCreated(event_id="e12", task=TEXT_TASK),
    TaskAcknowledged(event_id="e13", task_id="t1"),
    TaskStatusUpdated(event_id="e14", task_id="t1", status="Cancelled", error_message="by operator"),
    TaskFailed(event_id="e15", task_id="t1", error_type="NodeLost", error_message="n2 timed out"),
    TaskDeleted(event_id="e16", task_id="t1"),
    DownloadPending(event_id="e17", node_id="n1", model_id=MODEL, attempt_id="a1"),
    DownloadOngoing(
        event_id="e18", node_id="n1", model_id=MODEL, attempt_id="a1", downloaded_bytes=5, total_bytes=10
    ),
    DownloadCompleted(event_id="e19", node_id="n1", model_id=MODEL, attempt_id="a1", total_bytes=10),
    DownloadFailed(event_id="e20", node_id="n1", model_id=MODEL, attempt_id="a1", error_message="disk full"),
    TracingStateChanged(event_id="e21", enabled=True),
    StagedModelEvicted(event_id="e22", model_id=MODEL, node_ids=["n1"]),
    StagedModelEvicted(event_id="e23", model_id=MODEL),
    CustomModelCardAdded(event_id="e24", card=CARD),
    CustomModelCardDeleted(event_id="e25", model_id=CARD.model_id),
]
COMMANDS: list[BaseModel] = [
    PlaceInstance(command_id="c1", model_id=MODEL, sharding="Tensor", min_nodes=2, excluded_nodes=["n3"]),
    PlaceInstance(command_id="c1b", model_id=MODEL),
    CreateInstance(command_id="c2", instance=INSTANCE),
    DeleteInstance(command_id="c3", instance_id="i1"),
    GenerateText(command_id="c4", params=CHAT_PARAMS),
    GenerateText(command_id="c4b", params=RAW_PARAMS),
    RunWorkload(command_id="c5", params=EMBED_PARAMS),
    TaskFinished(command_id="c6", finished_command_id="c4"),
    CancelCommand(command_id="c7", cancelled_command_id="c4"),
    SetTracingEnabled(command_id="c8", enabled=False),
    RefuseInstancePlacement(
        command_id="c9", instance_id="i1", node_id="n2", needed_bytes=10, available_bytes=5, message="m"
    ),
    EvictStagedModel(command_id="c10", model_id=MODEL),
    RequestEventLog(command_id="c11", since_idx=42),
    StartDownload(command_id="c12", target_node_id="n2", model_id=MODEL),
    AddCustomModelCard(command_id="c13", card=CARD),
    DeleteCustomModelCard(command_id="c14", model_id=CARD.model_id),
    CancelDownload(command_id="c13", target_node_id="n2", model_id=MODEL),
]
TASKS: list[BaseModel] = [
    TEXT_TASK,
    WorkloadTask(owner_node_id="n1", task_id="t2", instance_id="i1", command_id="c5", params=EMBED_PARAMS, status="Running"),
    WorkloadTask(owner_node_id="n1", task_id="t3", instance_id="i1", command_id="c6", params=EMBED_PARAMS,
              status="Failed", error_type="RunnerCrashed", error_message="x"),
]
CHUNKS: list[BaseModel] = [
    TOKEN,
    TokenChunk(command_id="c1", text=""),
    ResultChunk(command_id="c5", result=EmbeddingResult(embeddings=[[0.5, -1.25], [3.0, 0.0]]), usage=USAGE),
    ErrorChunk(command_id="c1", error_type="ContextOverflow", message="too long"),
]
DATA_FRAMES: list[BaseModel] = [
    StreamStarted(command_id="c1", runner_id="r1"),
    StreamPayload(command_id="c1", seq=1, chunk=TOKEN),
    StreamTerminal(command_id="c1", seq=2, outcome="completed"),
    StreamTerminal(command_id="c1", seq=2, outcome="failed", error_type="RunnerCrashed", error_message="x"),
]
READINGS: list[BaseModel] = [
    NodeHeartbeat(node_id="n1"),
    RESOURCES,
    DownloadProgress(node_id="n1", model_id=MODEL, attempt_id="a1", downloaded_bytes=1, total_bytes=2),
]
DOWNLOAD_STATUSES: list[BaseModel] = [
    DownloadStatusPending(attempt_id="a1"),
    DownloadStatusCompleted(attempt_id="a1", total_bytes=10),
    DownloadStatusFailed(attempt_id="a1", error_message="x"),
]
STATE = State(
    nodes={"n1": NodeInfo(node_id="n1", node_name="box", version="0.1.0", last_seen=NOW)},
    edges=[EDGE, Edge(source="n1", sink="ghost", kind="session")],
    node_network={"n1": [NetworkInterface(name="lo", addresses=["127.0.0.1"], kind="loopback")]},
    instances={"i1": INSTANCE},
    runners={"r1": RunnerStatus(state="Ready")},
    tasks={"t1": TEXT_TASK, "t3": TASKS[2]},
    downloads={"n1": {MODEL: DOWNLOAD_STATUSES[1]}},
    tracing_enabled=True,
    last_event_applied_idx=9,
)
WRAPPERS: list[BaseModel] = [
    IndexedEvent(idx=0, origin="n1", indexed_at=NOW, event=EVENTS[0]),
    LocalEvent(origin="n1", origin_session="s1", origin_seq=3, event=EVENTS[11]),
    ForwarderCommand(origin="n1", command=COMMANDS[4]),
    STATE,
    NodeInfo(node_id="n2", node_name="b", version="v"),
    RESOURCES.memory,
    RESOURCES.disk,
]

UNIONS: list[tuple[str, TypeAdapter[Any], list[BaseModel]]] = [
    ("event", EVENT_ADAPTER, EVENTS),
    ("command", COMMAND_ADAPTER, COMMANDS),
    ("task", TASK_ADAPTER, TASKS),
    ("chunk", CHUNK_ADAPTER, CHUNKS),
    ("data_frame", DATA_FRAME_ADAPTER, DATA_FRAMES),
    ("telemetry", TELEMETRY_ADAPTER, READINGS),
    ("download_status", DOWNLOAD_STATUS_ADAPTER, DOWNLOAD_STATUSES),
]
UNION_CASES = [
    pytest.param(adapter, sample, id=f"{kind}-{type(sample).__name__}-{i}")
    for kind, adapter, samples in UNIONS
    for i, sample in enumerate(samples)
]
ALL_SAMPLES = [
    pytest.param(s, id=f"{type(s).__name__}-{i}")
    for i, s in enumerate([s for _, _, samples in UNIONS for s in samples] + WRAPPERS)
]

# Values that are free-form JSON (schemas, tool_choice) keep the caller's own keys.
OPAQUE_KEYS = {"parameters", "toolChoice"}


def _keys(obj: Any) -> list[str]:
    found: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            found.append(k)
            if k not in OPAQUE_KEYS:
                found.extend(_keys(v))
    elif isinstance(obj, list):
        for v in obj:
            found.extend(_keys(v))
    return found


def _members(adapter: TypeAdapter[Any]) -> set[type]:
    return set(get_args(get_args(adapter._type)[0]))


@pytest.mark.parametrize(("kind", "adapter", "samples"), UNIONS, ids=[u[0] for u in UNIONS])
def test_every_union_member_has_a_sample(kind: str, adapter: TypeAdapter[Any], samples: list[BaseModel]) -> None:
    assert _members(adapter) == {type(s) for s in samples}


@pytest.mark.parametrize(("adapter", "sample"), UNION_CASES)
def test_union_msgpack_round_trip(adapter: TypeAdapter[Any], sample: BaseModel) -> None:
    decoded = unpack(adapter, pack(sample))
    assert type(decoded) is type(sample)
    assert decoded == sample
    assert canonical_bytes(decoded) == canonical_bytes(sample)


@pytest.mark.parametrize(("adapter", "sample"), UNION_CASES)
def test_union_json_round_trip(adapter: TypeAdapter[Any], sample: BaseModel) -> None:
    assert adapter.validate_json(sample.model_dump_json(by_alias=True)) == sample
    assert adapter.validate_json(json.dumps(sample.to_wire())) == sample


@pytest.mark.parametrize("sample", ALL_SAMPLES)
def test_model_round_trips(sample: BaseModel) -> None:
    assert round_trip(sample) == sample
    assert type(sample).model_validate_json(canonical_bytes(sample)) == sample
    # populate_by_name: snake_case Python names decode as well.
    assert type(sample).model_validate(sample.model_dump()) == sample


@pytest.mark.parametrize("sample", ALL_SAMPLES)
def test_wire_keys_are_camel_case(sample: BaseModel) -> None:
    keys = _keys(sample.to_wire())
    assert keys
    assert [k for k in keys if "_" in k] == []


@pytest.mark.parametrize("sample", ALL_SAMPLES)
def test_extra_fields_rejected(sample: BaseModel) -> None:
    wire = {**sample.to_wire(), "fromTheFuture": 1}
    with pytest.raises(ValidationError, match="fromTheFuture"):
        type(sample).model_validate(wire)
    with pytest.raises(DecodeError, match="fromTheFuture"):
        unpack(type(sample), __import__("msgpack").packb(wire))


def test_extra_field_in_nested_model_rejected() -> None:
    wire = IndexedEvent(idx=0, origin="n1", indexed_at=NOW, event=EVENTS[6]).to_wire()
    wire["event"]["instance"]["shards"][0]["gpu"] = "H200"
    with pytest.raises(ValidationError):
        IndexedEvent.model_validate(wire)


def test_wire_shape_is_documented_camel_case() -> None:
    wire = IndexedEvent(idx=3, origin="n1", indexed_at=NOW, event=EVENTS[2]).to_wire()
    assert wire == {
        "idx": 3,
        "origin": "n1",
        "indexedAt": "2025-01-02T03:04:05.678901Z",
        "event": {
            "eventId": "e3",
            "type": "NodeTimedOut",
            "nodeId": "n1",
            "lastEventAgeS": 40.5,
            "heartbeatAgeS": 31.0,
            "telemetryAgeS": None,
            "effectiveAgeS": 31.0,
            "timeoutS": 30.0,
            "cause": "silence",
        },
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-01-02T03:04:05.678901Z", NOW),
        ("2025-01-02T05:04:05.678901+02:00", NOW),
        ("2025-01-02T03:04:05.678901+00:00", NOW),
    ],
)
def test_iso_string_datetimes_decode_to_utc(text: str, expected: datetime) -> None:
    wire = {"idx": 0, "origin": "n1", "indexedAt": text, "event": EVENTS[1].to_wire()}
    decoded = IndexedEvent.model_validate(wire)
    assert decoded.indexed_at == expected
    assert decoded.indexed_at.tzinfo is UTC
    info = NodeInfo.model_validate({"nodeId": "n", "nodeName": "x", "version": "v", "lastSeen": text})
    assert info.last_seen == expected


def test_offset_spelling_does_not_change_canonical_bytes() -> None:
    shifted = NOW.astimezone(timezone(timedelta(hours=-7)))
    a = IndexedEvent(idx=0, origin="n1", indexed_at=NOW, event=EVENTS[1])
    b = IndexedEvent(idx=0, origin="n1", indexed_at=shifted, event=EVENTS[1])
    assert canonical_bytes(a) == canonical_bytes(b)


def test_naive_datetime_rejected() -> None:
    with pytest.raises(ValidationError):
        IndexedEvent(idx=0, origin="n1", indexed_at=datetime(2025, 1, 1), event=EVENTS[1])


def test_negative_index_rejected() -> None:
    with pytest.raises(ValidationError):
        IndexedEvent(idx=-1, origin="n1", indexed_at=NOW, event=EVENTS[1])


def test_unknown_event_tag_is_a_decode_error() -> None:
    bad = {**EVENTS[1].to_wire(), "type": "NodeExploded"}
    with pytest.raises(DecodeError, match="NodeExploded"):
        unpack(EVENT_ADAPTER, __import__("msgpack").packb(bad))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01"])
def test_garbage_bytes_are_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        unpack(State, data)


def test_frozen() -> None:
    with pytest.raises(ValidationError):
        STATE.tracing_enabled = False  # type: ignore[misc]


def _shard(rank: int, world: int, runner: str = "") -> ShardAssignment:
    return ShardAssignment(
        node_id=f"n{rank}", runner_id=runner or f"r{rank}", rank=rank, world_size=world,
        start_layer=rank, end_layer=rank + 1, backend="b",
    )


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=[], context_token_limit=1), id="no-shards"),
        pytest.param(lambda: Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=[_shard(1, 2), _shard(0, 2)], context_token_limit=1), id="ranks-out-of-order"),
        pytest.param(lambda: Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=[_shard(0, 3), _shard(1, 3)], context_token_limit=1), id="world-size-mismatch"),
        pytest.param(lambda: Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=[_shard(0, 2, "r"), _shard(1, 2, "r")], context_token_limit=1), id="shared-runner"),
        pytest.param(lambda: Instance(instance_id="i", model_id="m", sharding="Pipeline", shards=[_shard(0, 1)], context_token_limit=1, repair_hop=3), id="repair-hop-bound"),
        pytest.param(lambda: ShardAssignment(node_id="n", runner_id="r", rank=0, world_size=1, start_layer=4, end_layer=4, backend="b"), id="empty-layers"),
        pytest.param(lambda: ShardAssignment(node_id="n", runner_id="r", rank=1, world_size=1, start_layer=0, end_layer=4, backend="b"), id="rank-outside-world"),
        pytest.param(lambda: TextGenerationParams(model_id="m"), id="no-input"),
        pytest.param(lambda: TextGenerationParams(model_id="m", prompt="p", messages=[ChatMessage(role="user", content="x")]), id="two-inputs"),
        pytest.param(lambda: TextGenerationParams(model_id="m", prompt="p", temperature=math.nan), id="nan-temperature"),
        pytest.param(lambda: EmbeddingParams(model_id="m", inputs=[]), id="no-embedding-inputs"),
        pytest.param(lambda: Edge(source="n1", sink="n1", kind="session"), id="self-loop"),
        pytest.param(lambda: StreamPayload(command_id="c2", seq=1, chunk=TOKEN), id="payload-for-other-command"),
        pytest.param(lambda: StreamPayload(command_id="c1", seq=0, chunk=TOKEN), id="payload-seq-zero"),
        pytest.param(lambda: StreamStarted(command_id="c1", runner_id="r", seq=1), id="started-not-first"),
        pytest.param(lambda: StreamTerminal(command_id="c1", seq=1, outcome="failed"), id="unexplained-failure"),
        pytest.param(lambda: ResultChunk(command_id="c", result=EmbeddingResult(embeddings=[[math.inf]])), id="inf-embedding"),
        pytest.param(lambda: TokenChunk(command_id="c", text="", logprob=math.nan), id="nan-logprob"),
        pytest.param(lambda: NodeTimedOut(event_id="e", node_id="n", last_event_age_s=-1, effective_age_s=1, timeout_s=1), id="negative-age"),
        pytest.param(lambda: PlaceInstance(command_id="c", model_id="m", min_nodes=0), id="zero-min-nodes"),
    ],
)
def test_invariants_rejected_at_construction(build: Any) -> None:
    with pytest.raises(ValidationError):
        build()


def test_minus_infinity_logprob_is_clamped_to_floor() -> None:
    chunk = TokenChunk(command_id="c", text="x", logprob=-math.inf,
                       top_logprobs=[TopLogprob(token="y", logprob=-math.inf)])
    assert chunk.logprob == LOGPROB_FLOOR
    assert round_trip(chunk) == chunk


def test_edges_in_state_are_sorted_and_unique_when_decoded() -> None:
    a = Edge(source="a", sink="b", kind="session")
    b = Edge(source="a", sink="b", kind="probed", address="x")
    c = Edge(source="a", sink="b", kind="probed")
    state = State(edges=[a, b, a, c])
    assert state.edges == [c, b, a]


def test_graph_node_ids_include_phantoms() -> None:
    assert STATE.graph_node_ids() == ["ghost", "n1", "n2"]
    assert STATE.phantom_node_ids() == ["ghost", "n2"]
