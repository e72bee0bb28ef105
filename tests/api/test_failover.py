"""A change of master ends only the streams it affects; the others run to their end."""

from __future__ import annotations

import pytest

from skulk.api.errors import StreamFailed
from skulk.api.failover import failover_failures
from skulk.api.streams import CommandStreams
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams


def _instance(instance_id: str, nodes: list[str]) -> Instance:
    return Instance(
        instance_id=instance_id, model_id="m", sharding="Pipeline", context_token_limit=1024,
        shards=[ShardAssignment(node_id=n, runner_id=f"{instance_id}-r{i}", rank=i, world_size=len(nodes),
                                start_layer=i, end_layer=i + 1, backend="cpu") for i, n in enumerate(nodes)],
    )


def _task(command: str, instance_id: str) -> TextGeneration:
    return TextGeneration(owner_node_id="api", task_id=f"t-{command}", instance_id=instance_id, command_id=command,
                          params=TextGenerationParams(model_id="m", prompt="x"))


STATE = State(
    instances={"on-b": _instance("on-b", ["b"]), "on-old": _instance("on-old", ["old"]),
               "b-and-old": _instance("b-and-old", ["b", "old"])},
    tasks={t.task_id: t for t in (_task("c-b", "on-b"), _task("c-old", "on-old"), _task("c-span", "b-and-old"),
                                  _task("c-gone", "deleted"))},
)
ALIVE = frozenset({"api", "b"})  # the old master's presence is gone


@pytest.mark.parametrize(
    ("command", "ends", "why"),
    [
        ("c-b", False, None),  # untouched node: continues to its end
        ("c-old", True, "node old"),  # served by the node that went with the old master
        ("c-span", True, "node old"),  # one rank on it is enough
        ("c-gone", True, "instance is gone"),
        ("c-unknown", True, "before this request reached"),  # never logged: may be lost with the old master
    ],
)
def test_failover_ends_only_affected_streams(command: str, ends: bool, why: str | None) -> None:
    failures = failover_failures(STATE, [command], ALIVE, "b.2")
    assert (command in failures) is ends
    if why is not None:
        assert why in failures[command] and "b.2" in failures[command]


def test_when_the_old_master_lives_on_nothing_of_its_nodes_fails() -> None:
    assert failover_failures(STATE, ["c-b", "c-old", "c-span"], ALIVE | {"old"}, "b.2") == {}


async def test_fail_failover_ends_the_listed_streams_and_keeps_the_rest() -> None:
    streams = CommandStreams()
    kept, ended = streams.open("c-b"), streams.open("c-old")
    assert streams.fail_failover("MasterFailover", {"c-old": "gone", "c-never-opened": "x"}) == 1
    assert not kept.ended and ended.ended
    with pytest.raises(StreamFailed) as failure:
        await anext(ended)
    assert (failure.value.error_type, failure.value.message) == ("MasterFailover", "gone")
    assert streams.stats()["failedByFailover"] == 1 and streams.stats()["openStreams"] == 1
