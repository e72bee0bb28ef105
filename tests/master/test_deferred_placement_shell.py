"""The master shell holds a placement refused only because cluster info is pending and
places it on a later plan tick once the info has arrived (the CI hang of stop 45: an API
node that had its own resources promised an instance id the master then dropped). The
rules are table-tested in test_deferred_placements; this drives the real `Master` with a
stand-in router, a real event log and a telemetry view that gains the node's resources."""

from __future__ import annotations

import asyncio
from pathlib import Path

from skulk.cluster.replica import StateReplica
from skulk.master.main import EventLogSlot, Master
from skulk.shared.telemetry_view import NodeTelemetry, TelemetryView
from skulk.shared.types.commands import ForwarderCommand, PlaceInstance
from skulk.shared.types.events import InstanceCreated
from tests.master.test_placement import CARDS, GB, LLAMA_CPU, cluster, res

CARD = CARDS["local/tiny-llama-gguf"]


class RecordingRouter:
    node_id = "m"

    def __init__(self) -> None:
        self.published: list[object] = []

    async def publish(self, topic: object, message: object, to_node: str | None = None) -> None:
        self.published.append(message)


def created(router: RecordingRouter) -> list[str]:
    return [m.event.event.instance.instance_id for m in router.published  # type: ignore[attr-defined]
            if isinstance(getattr(getattr(m, "event", None), "event", None), InstanceCreated)]


def test_a_placement_waiting_for_a_nodes_resources_is_placed_once_they_arrive(tmp_path: Path) -> None:
    router = RecordingRouter()
    replica = StateReplica(router)  # type: ignore[arg-type]
    replica.state = cluster(["m", "n"]).model_copy(update={"last_event_applied_idx": -1})
    replica.adopt_session("m", "m.1", i_am_master=True)  # type: ignore[arg-type]
    telemetry = [TelemetryView()]  # the master has heard nobody's resources yet
    master = Master(router, replica, EventLogSlot(tmp_path / "log"), lambda: telemetry[0],  # type: ignore[arg-type]
                    session_id="m.1", cards=lambda: {CARD.model_id: CARD})
    master._seed()
    command = PlaceInstance(command_id="c1", model_id=CARD.model_id, instance_id="i1")

    async def scenario() -> None:
        await master._on_command(ForwarderCommand(origin="n", command=command))
        assert created(router) == [] and master.stats()["deferredPlacements"] == 1
        await master._retry_deferred()  # still nothing known: held again, not refused
        assert created(router) == [] and master.stats()["deferredPlacements"] == 1
        telemetry[0] = TelemetryView(nodes={
            "n": NodeTelemetry(resources=res("n", 8 * GB, LLAMA_CPU)),  # type: ignore[dict-item]
            "m": NodeTelemetry(resources=res("m", 8 * GB, LLAMA_CPU)),  # type: ignore[dict-item]
        })
        await master._retry_deferred()
        assert created(router) == ["i1"] and "i1" in replica.state.instances
        assert master.stats()["deferredPlacements"] == 0 and master.stats()["refusedCommands"] == 0
        await master._on_command(ForwarderCommand(origin="n", command=command))  # a copy: placed once
        assert created(router) == ["i1"]

    asyncio.run(scenario())
