"""The worker's ordered rules, one table per rule, on hand-built views (no processes)."""

import pytest

from skulk.shared.types.common import ChatMessage
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams
from skulk.store.cards import builtin_cards_dir, load_card
from skulk.worker.plan import (
    CancelRunnerTask,
    DispatchTask,
    LocalRunner,
    ReportRunnerFailed,
    ResolveArtifact,
    SpawnRunner,
    StopRunner,
    WorkerView,
    plan,
)

CARD = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
CARDS = {CARD.model_id: CARD}
ME = "me"
INSTANCE = Instance(
    instance_id="i1", model_id=CARD.model_id, sharding="Pipeline",
    shards=[ShardAssignment(node_id=ME, runner_id="r1", rank=0, world_size=1, start_layer=0,
                            end_layer=CARD.num_layers, backend="llama_cpp-cpu")],
    context_token_limit=2048,
)
ELSEWHERE = INSTANCE.model_copy(update={
    "instance_id": "i2",
    "shards": [INSTANCE.shards[0].model_copy(update={"node_id": "other", "runner_id": "r2"})],
})
PARAMS = TextGenerationParams(model_id=CARD.model_id, messages=[ChatMessage(role="user", content="hi")])
TASK = TextGeneration(task_id="t1", instance_id="i1", command_id="c1", owner_node_id="api", params=PARAMS)
READY = RunnerStatus(state="Ready")
STATE = State(instances={"i1": INSTANCE}, tasks={"t1": TASK})
PATH = {CARD.model_id: "/models/tiny.gguf"}
GIB = 1024**3


def view(**overrides) -> WorkerView:
    base = dict(node_id=ME, state=STATE, cards=CARDS, ram_available_bytes=64 * GIB)
    return WorkerView(**{**base, **overrides})


def runner(runner_id="r1", instance_id="i1", state="Ready", in_flight=()):
    return {runner_id: LocalRunner(runner_id=runner_id, instance_id=instance_id, status=RunnerStatus(state=state),
                                   in_flight=frozenset(in_flight))}


@pytest.mark.parametrize(
    ("name", "v", "expected"),
    [
        ("nothing to do without instances", view(state=State()), None),
        ("instance elsewhere is not ours", view(state=State(instances={"i2": ELSEWHERE})), None),
        ("resolve the model first", view(), ResolveArtifact(CARD.model_id)),
        ("resolution in progress: wait", view(resolving=frozenset({CARD.model_id})), None),
        ("artifact ready: spawn", view(artifacts=PATH),
         SpawnRunner(INSTANCE, INSTANCE.shards[0], CARD, "/models/tiny.gguf")),
        ("artifact failed: report", view(artifact_failures={CARD.model_id: "no network"}),
         ReportRunnerFailed("r1", f"model {CARD.model_id} unavailable: no network")),
        ("failure already reported", view(artifact_failures={CARD.model_id: "x"}, reported_failed=frozenset({"r1"})), None),
        ("gave up after crashes: no respawn", view(artifacts=PATH, given_up=frozenset({"r1"})), None),
        ("runner loading: task waits", view(artifacts=PATH, runners=runner(state="Loading")), None),
        ("runner ready: dispatch", view(artifacts=PATH, runners=runner()), DispatchTask("r1", TASK)),
        ("already dispatched", view(artifacts=PATH, runners=runner(in_flight=["t1"]), dispatched=frozenset({"t1"})), None),
        ("orphaned runner stops first", view(state=State(), runners=runner()), StopRunner("r1", "instance i1 is gone")),
        ("cancelled task is cancelled on the runner",
         view(state=STATE.model_copy(update={"tasks": {"t1": TASK.model_copy(update={"status": "Cancelled"})}}),
              artifacts=PATH, runners=runner(in_flight=["t1"]), dispatched=frozenset({"t1"})),
         CancelRunnerTask("r1", "t1")),
        ("deleted task is cancelled on the runner",
         view(state=STATE.model_copy(update={"tasks": {}}), artifacts=PATH, runners=runner(in_flight=["t1"]),
              dispatched=frozenset({"t1"})),
         CancelRunnerTask("r1", "t1")),
        ("complete task is not dispatched",
         view(state=STATE.model_copy(update={"tasks": {"t1": TASK.model_copy(update={"status": "Complete"})}}),
              artifacts=PATH, runners=runner()),
         None),
    ],
)
def test_plan(name, v, expected):
    assert plan(v) == expected


def test_memory_guard_refuses_a_shard_that_does_not_fit_live_memory():
    action = plan(view(artifacts=PATH, ram_available_bytes=1024))
    assert isinstance(action, ReportRunnerFailed) and "GB is free" in action.message


def test_memory_guard_tolerates_a_small_miss():
    from skulk.shared.memory_estimate import assignment_footprint

    needed = assignment_footprint(CARD, INSTANCE.shards[0]).total_bytes
    # 5 % short of the footprint: within the 10 % tolerance, so the runner starts.
    action = plan(view(artifacts=PATH, ram_available_bytes=int(needed / 1.05)))
    assert isinstance(action, SpawnRunner)
    action = plan(view(artifacts=PATH, ram_available_bytes=int(needed / 1.2)))
    assert isinstance(action, ReportRunnerFailed)
