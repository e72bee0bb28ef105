"""The telemetry plane, both directions.

Out: a payload-free heartbeat every `HEARTBEAT_INTERVAL_S` and this node's resources every
`RESOURCES_INTERVAL_S`, through a bounded latest-value outbox (a producer never waits for
the network; a newer reading replaces an unsent older one). In: every reading is stamped
with the local receipt time into the `TelemetryView` (liveness never trusts a sender's
clock). Nothing here is event-sourced.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path

import psutil

from skulk import __version__
from skulk.facts.build import build_commit
from skulk.facts.nvml import collect_gpus
from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS
from skulk.shared.telemetry_view import TelemetryView, record
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.ids import NodeId
from skulk.shared.types.telemetry import (
    CapabilityConflict,
    DiskReading,
    EngineProvision,
    GpuReading,
    MemoryReading,
    NodeHeartbeat,
    NodeResources,
    ServingCounters,
    TelemetryReading,
)

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 2.0
RESOURCES_INTERVAL_S = 5.0
OUTBOX_KEYS = 256
"""The latest-value admission map's bound: distinct (reading kind[, model]) keys awaiting send."""


class LatestValueOutbox:
    """Bounded map of readings waiting to be published; a newer value for a key replaces the
    older one, and past the bound the oldest key is evicted (counted)."""

    def __init__(self, capacity: int = OUTBOX_KEYS) -> None:
        self._items: OrderedDict[Hashable, TelemetryReading] = OrderedDict()
        self._capacity = capacity
        self._ready = asyncio.Event()
        self.replaced = 0
        self.evicted = 0

    def put(self, key: Hashable, reading: TelemetryReading) -> None:
        if key in self._items:
            self.replaced += 1
            del self._items[key]
        self._items[key] = reading
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)
            self.evicted += 1
        self._ready.set()

    async def take(self) -> TelemetryReading:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        _key, reading = self._items.popitem(last=False)
        return reading

    def stats(self) -> dict[str, int]:
        return {"depth": len(self._items), "capacity": self._capacity, "replaced": self.replaced, "evicted": self.evicted}


class TelemetryService:
    def __init__(
        self,
        router: Router,
        *,
        node_name: str,
        models_dir: Path,
        api_endpoint: str | None,
        backends: Callable[[], list[str]] = lambda: [],
        conflicts: Callable[[], list[CapabilityConflict]] = lambda: [],
        engine_slots: Callable[[], dict[str, int]] = lambda: {},
        engine_provision: Callable[[], EngineProvision | None] = lambda: None,
        serving: Callable[[], ServingCounters | None] = lambda: None,
        disk_reserve_bytes: int | None = None,
        hardware_class: Callable[[int, list[GpuReading]], str | None] = lambda _ram, _gpus: None,
        capability_tags: Callable[[], list[str]] = lambda: [],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._router = router
        self._node_name = node_name
        self._models_dir = models_dir
        self._disk_reserve_bytes = disk_reserve_bytes
        self._api_endpoint = api_endpoint
        self._backends = backends
        self._conflicts = conflicts
        self._engine_slots = engine_slots
        self._engine_provision = engine_provision
        self._serving = serving
        self._hardware_class = hardware_class
        """(RAM total bytes, GPU readings) -> this node's class (`skulk.shared.hardware_class`)."""
        self._capability_tags = capability_tags
        """The tags this node advertises (`skulk.extensions.capability_tags`), sorted."""
        self._clock = clock
        self.view = TelemetryView()
        self.outbox = LatestValueOutbox()
        self.received = 0

    @property
    def node_id(self) -> NodeId:
        return NodeId(self._router.node_id)

    def resources(self, serving: ServingCounters | None = None) -> NodeResources:
        """This node's reading (blocking: run it on a thread). `serving` is read on the event
        loop by the caller, where the counters and runner table it comes from live."""
        memory = psutil.virtual_memory()
        try:
            disk = shutil.disk_usage(self._models_dir)
            disk_reading = DiskReading(models_dir=str(self._models_dir), total_bytes=disk.total, free_bytes=disk.free,
                                       reserve_bytes=self._disk_reserve_bytes)
        except OSError:
            disk_reading = DiskReading(models_dir=str(self._models_dir), total_bytes=0, free_bytes=0,
                                       reserve_bytes=self._disk_reserve_bytes)
        gpus = collect_gpus()
        return NodeResources(
            node_id=self.node_id,
            node_name=self._node_name,
            version=__version__,
            commit=build_commit(),
            memory=MemoryReading(ram_total_bytes=memory.total, ram_available_bytes=memory.available),
            disk=disk_reading,
            backends=self._backends(),
            capability_conflicts=self._conflicts(),
            api_endpoint=self._api_endpoint,
            zenoh_connected_peers=self._router.connected_peer_count(),
            gpus=gpus,
            engine_slots=self._engine_slots(),
            engine_provision=self._engine_provision(),
            serving=serving,
            hardware_class=self._hardware_class(memory.total, gpus),
            capability_tags=self._capability_tags(),
        )

    def publish(self, key: Hashable, reading: TelemetryReading) -> None:
        """Admit a local reading: recorded here at once, sent when the network takes it."""
        self.view = record(self.view, self.node_id, reading, self._clock())
        self.outbox.put(key, reading)

    async def _produce(self) -> None:
        next_resources = 0.0
        while True:
            now = self._clock()
            self.publish("heartbeat", NodeHeartbeat(node_id=self.node_id))
            if now >= next_resources:
                resources = await asyncio.to_thread(self.resources, self._serving())
                self.publish("resources", resources)
                next_resources = now + RESOURCES_INTERVAL_S
            # On the process's tick grid (`shared.ticks`): the other periodic loops wake with it.
            await asyncio.sleep(until_tick_s(asyncio.get_running_loop().time(), HEARTBEAT_INTERVAL_S))

    async def _drain(self) -> None:
        while True:
            reading = await self.outbox.take()
            try:
                await self._router.publish(TOPICS.telemetry, reading)
            except RouterError as exc:
                logger.debug("telemetry publish failed: %s", exc)

    async def _receive(self) -> None:
        async for received in self._router.subscribe(TOPICS.telemetry, own=False):  # ours: recorded at admission
            self.received += 1
            self.view = record(self.view, NodeId(received.sender), received.message, self._clock())

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._produce())
            group.create_task(self._drain())
            group.create_task(self._receive())

    def stats(self) -> dict[str, object]:
        return {"outbox": self.outbox.stats(), "received": self.received, "nodesSeen": len(self.view.nodes)}
