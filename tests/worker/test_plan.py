"""The worker's ordered rules, one table per rule, on hand-built views (no processes)."""

import pytest

import skulk.worker.plan as worker_plan_module
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.memory_estimate import assignment_footprint
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams
from skulk.worker.plan import (
    CancelRunnerTask,
    DispatchTask,
    LocalRunner,
    RefusePlacement,
    ReportRunnerFailed,
    ResolveArtifact,
    SpawnRunner,
    StopRunner,
    WorkerView,
    plan,
    still_unconfirmed,
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
    base = dict(node_id=ME, state=STATE, cards=CARDS, ram_available_bytes=64 * GIB, task_inputs=frozenset({"c1"}))
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
        ("input (the request's text) not here yet: wait",
         view(artifacts=PATH, runners=runner(), task_inputs=frozenset()), None),
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
    assert isinstance(action, RefusePlacement) and "GB is free" in action.message
    assert (action.runner_id, action.instance_id, action.available_bytes) == ("r1", "i1", 1024)


NEEDED = assignment_footprint(CARD, INSTANCE.shards[0]).total_bytes


@pytest.mark.parametrize(
    ("name", "available", "expected"),
    [
        ("plenty of memory: spawn", 64 * GIB, SpawnRunner),
        ("5 % short: within the 10 % tolerance, spawn", int(NEEDED / 1.05), SpawnRunner),
        ("exactly at the tolerance edge: spawn", -(-NEEDED * 10 // 11), SpawnRunner),
        ("20 % short: refuse and ask for a re-placement", int(NEEDED / 1.2), RefusePlacement),
        ("unknown live memory: spawn (the master admitted it)", None, SpawnRunner),
    ],
)
def test_memory_guard_tolerance(name, available, expected):
    assert type(plan(view(artifacts=PATH, ram_available_bytes=available))) is expected


@pytest.mark.parametrize(
    ("name", "v"),
    [
        ("already refused: not again", view(artifacts=PATH, ram_available_bytes=1024, reported_failed=frozenset({"r1"}))),
        ("runner already running: no guard", view(artifacts=PATH, ram_available_bytes=1024, runners=runner())),
        ("shard elsewhere: not ours to refuse", view(state=State(instances={"i2": ELSEWHERE}), ram_available_bytes=1024)),
    ],
)
def test_memory_guard_refuses_once_and_only_its_own_unstarted_shards(name, v):
    assert not isinstance(plan(v), RefusePlacement)


def test_embedding_tasks_dispatch_to_rank_zero_like_generations():
    from skulk.shared.types.tasks import EmbeddingParams, WorkloadTask

    task = WorkloadTask(task_id="t1", instance_id="i1", command_id="c1", owner_node_id="api",
                     params=EmbeddingParams(model_id=CARD.model_id, inputs=["hi"]))
    v = view(state=STATE.model_copy(update={"tasks": {"t1": task}}), artifacts=PATH, runners=runner())
    assert plan(v) == DispatchTask("r1", task)


@pytest.mark.parametrize(("status", "in_state", "expected"), [
    ("Running", True, {"t1"}),      # done on the runner, State not told yet: still dispatched
    ("Pending", True, {"t1"}),
    ("Complete", True, set()),      # State caught up: forget it
    ("Failed", True, set()),
    ("Running", False, set()),      # the task left State: forget it
])
def test_a_finished_task_counts_as_dispatched_until_state_shows_it_terminal(status, in_state, expected):
    state = State(tasks={"t1": TASK.model_copy(update={"status": status})} if in_state else {})
    assert still_unconfirmed(frozenset({"t1"}), state) == expected


@pytest.mark.parametrize(
    ("world_size", "served", "breaker_tripped", "verdict"),
    [
        (1, False, False, worker_plan_module.RestartRunner()),
        (1, True, False, worker_plan_module.RestartRunner()),  # a lone runner may come back after serving
        (1, False, True, worker_plan_module.GiveUpRunner(
            "keeps failing: the crash breaker tripped, the worker will not restart it")),
        (2, False, False, worker_plan_module.RestartRunner()),  # a rank that never served may still join
        (2, True, False, worker_plan_module.GiveUpRunner(
            "failed after serving in a multi-rank group; the group is re-placed")),
        (2, True, True, worker_plan_module.GiveUpRunner(
            "failed after serving in a multi-rank group; the group is re-placed")),
    ],
)
def test_after_runner_failure(world_size, served, breaker_tripped, verdict) -> None:  # type: ignore[no-untyped-def]
    assert worker_plan_module.after_runner_failure(world_size, served, breaker_tripped) == verdict


def test_a_given_up_status_says_the_worker_stopped_and_keeps_the_last_failure() -> None:
    failed = RunnerStatus(state="Failed", error_message="runner exited with code -9", served=True)
    status = worker_plan_module.given_up_status(failed, worker_plan_module.GiveUpRunner("keeps failing"))
    assert status == RunnerStatus(state="Failed", served=True, gave_up=True,
                                  error_message="keeps failing; last failure: runner exited with code -9")
    bare = worker_plan_module.given_up_status(RunnerStatus(state="Failed"), worker_plan_module.GiveUpRunner("x"))
    assert bare.gave_up and bare.error_message == "x; last failure: no reason given"
