"""Telemetry-plane readings: latest-value observations, not decisions.

Readings are gossiped last-write-wins and land in an in-memory view keyed by node (and by
model for download progress). They are NOT events: they are never indexed, logged, replayed
or applied to State, so a chatty reading can never grow the event log. Receivers stamp
their own receipt time for liveness; no reading carries a sender clock that is trusted.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import NonNegInt
from skulk.shared.types.ids import DownloadAttemptId, ModelId, NodeId


class NodeHeartbeat(WireModel):
    """Payload-free liveness signal, published every couple of seconds by every node."""

    type: Literal["NodeHeartbeat"] = "NodeHeartbeat"
    node_id: NodeId


class MemoryReading(WireModel):
    ram_total_bytes: NonNegInt
    ram_available_bytes: NonNegInt


class DiskReading(WireModel):
    models_dir: str
    total_bytes: NonNegInt
    free_bytes: NonNegInt
    reserve_bytes: NonNegInt | None = None
    """The free space this node's downloads and staging always leave (its configured
    `disk_reserve_gb`); None when the node did not say."""


class CapabilityConflict(WireModel):
    """Something a node's probed facts contradict (e.g. a GPU build with no GPU), with the
    fix an operator should apply."""

    code: str
    level: Literal["info", "warn", "error"]
    message: str
    remediation: str | None = None


class GpuReading(WireModel):
    """One accelerator as its driver reports it now (NVML for NVIDIA): what placement admits
    GPU-backed instances against. None where the driver did not answer that query."""

    vendor: Literal["nvidia", "amd", "apple", "intel"]
    index: NonNegInt
    name: str
    vram_total_bytes: NonNegInt
    vram_free_bytes: NonNegInt
    utilization_percent: NonNegInt | None = None
    temperature_c: int | None = None
    power_watts: float | None = None


class EngineProvision(WireModel):
    """The node's background build of a native llama-server (`skulk engines install`, started
    at node start unless SKULK_NO_ENGINE_AUTOPROVISION is set): what /state, the doctor and the
    dashboard show while a fresh node serves with the bundled llama-server."""

    state: Literal["building", "ready", "failed", "skipped"]
    backend: str
    """The compute the build is for ('cpu', 'cuda', 'vulkan', 'metal')."""
    step: str | None = None
    """'wait' (another node on this machine is building), 'download', 'build', 'install'."""
    done: NonNegInt = 0
    total: NonNegInt | None = None
    message: str = ""
    """Why it was skipped or failed, with the fix; where the build went when ready."""


class InstanceLoad(WireModel):
    """What one instance's runners on a node hold now."""

    in_flight: NonNegInt = 0
    """Generations running."""
    queue_depth: NonNegInt = 0
    """Messages waiting in the runners' inboxes."""


class ServingCounters(WireModel):
    """A node's serving totals since it started, for rates over time (the dashboard's charts
    take differences between two readings): what its API streamed to clients, and the load on
    its runners now. Counts only: no model output, no prompt."""

    generated_tokens: NonNegInt = 0
    generations: NonNegInt = 0
    failed_generations: NonNegInt = 0
    ttft_seconds_sum: float = Field(default=0.0, ge=0)
    ttft_count: NonNegInt = 0
    instances: dict[str, InstanceLoad] = Field(default_factory=dict)
    """Instance id -> its runners' load on this node."""


class NodeResources(WireModel):
    type: Literal["NodeResources"] = "NodeResources"
    node_id: NodeId
    node_name: str
    version: str
    commit: str | None = None
    """The source commit this node runs (`skulk.facts.build`); None for a plain release install."""
    memory: MemoryReading
    disk: DiskReading
    backends: list[str] = Field(default_factory=list)
    capability_conflicts: list[CapabilityConflict] = Field(default_factory=list)
    api_endpoint: str | None = None
    zenoh_connected_peers: NonNegInt | None = None
    gpus: list[GpuReading] = Field(default_factory=list)
    """Discrete accelerators with a VRAM reading (empty on CPU-only and Apple nodes)."""
    engine_slots: dict[str, int] = Field(default_factory=dict)
    """Served engine -> the node's slot setting (llama_server's SKULK_LLAMA_SERVER_PARALLEL,
    vllm's SKULK_VLLM_MAX_CONCURRENT_REQUESTS): what placement stamps on a shard, memory
    permitting. An engine absent here gets its default (`skulk.shared.slots`)."""
    engine_provision: EngineProvision | None = None
    """The background native build, while one runs or when it ended or was skipped; None
    when the node never considered one (opted out, an override, a build already there)."""
    serving: ServingCounters | None = None
    """Serving totals and runner load (None: the node runs no API and no runners yet)."""
    hardware_class: str | None = None
    """The node's canonical hardware class (`skulk.shared.hardware_class`: platform, chip or
    GPU model, memory; never a name or address), which opted-in field telemetry reports for
    the generations it serves and for its loss. None when the node did not compute one."""
    capability_tags: list[str] = Field(default_factory=list)
    """Opaque capability tags this node advertises (its extensions' `advertise_capability`,
    `skulk.extensions.capability_tags`): sorted, at most 32. Peers see a change on the next
    reading; nothing about a tag is event-sourced."""


class DownloadProgress(WireModel):
    """Non-terminal progress of one download attempt. Terminal outcomes are events
    (DownloadCompleted/DownloadFailed); `attempt_id` lets a receiver drop a late sample of
    an older attempt that would otherwise override a newer decision."""

    type: Literal["DownloadProgress"] = "DownloadProgress"
    node_id: NodeId
    model_id: ModelId
    attempt_id: DownloadAttemptId
    downloaded_bytes: NonNegInt
    total_bytes: NonNegInt


TelemetryReading = Annotated[
    NodeHeartbeat | NodeResources | DownloadProgress,
    Field(discriminator="type"),
]
TELEMETRY_ADAPTER: TypeAdapter[TelemetryReading] = TypeAdapter(TelemetryReading)

__all__ = [
    "TELEMETRY_ADAPTER",
    "CapabilityConflict",
    "DiskReading",
    "DownloadProgress",
    "EngineProvision",
    "GpuReading",
    "InstanceLoad",
    "MemoryReading",
    "NodeHeartbeat",
    "NodeResources",
    "ServingCounters",
    "TelemetryReading",
]
