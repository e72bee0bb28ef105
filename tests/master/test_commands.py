import itertools

import pytest

from skulk.master.commands import UNPLACED_INSTANCE, DecisionContext, Refusal, decide, ready_instance_for
from skulk.shared.types.commands import (
    CancelCommand,
    CreateInstance,
    DeleteInstance,
    EvictStagedModel,
    GenerateText,
    PlaceInstance,
    SetTracingEnabled,
    TaskFinished,
)
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.events import (
    InstanceCreated,
    InstanceDeleted,
    StagedModelEvicted,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TracingStateChanged,
)
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.tasks import EmbeddingParams, TextGeneration, TextGenerationParams, WorkloadTask

INSTANCE = Instance(
    instance_id="i1", model_id="local/tiny-llama", sharding="Pipeline",
    shards=[ShardAssignment(node_id="n1", runner_id="r1", rank=0, world_size=1, start_layer=0, end_layer=6,
                            backend="mlx-cpu")],
    context_token_limit=2048,
)
OPEN = WorkloadTask(owner_node_id="n1", task_id="t1", instance_id="i1", command_id="c", params=EmbeddingParams(model_id="m", inputs=["x"]))
DONE = WorkloadTask(owner_node_id="n1", task_id="t2", instance_id="i1", command_id="c", params=EmbeddingParams(model_id="m", inputs=["x"]),
                 status="Complete")
STATE = State(nodes={"n1": NodeInfo(node_id="n1", node_name="a", version="1")}, instances={"i1": INSTANCE},
              tasks={"t1": OPEN, "t2": DONE})


def ids():
    counter = itertools.count()
    return DecisionContext(new_id=lambda: f"e{next(counter)}", origin="n1")


def kinds(decision):
    return decision.code if isinstance(decision, Refusal) else [type(e).__name__ for e in decision]


@pytest.mark.parametrize(
    ("state", "command", "expected"),
    [
        (State(), SetTracingEnabled(command_id="c", enabled=True), ["TracingStateChanged"]),
        (State(tracing_enabled=True), SetTracingEnabled(command_id="c", enabled=True), []),
        (STATE, DeleteInstance(command_id="c", instance_id="i1"), ["TaskStatusUpdated", "InstanceDeleted"]),
        (STATE, DeleteInstance(command_id="c", instance_id="nope"), "unknown_instance"),
        (STATE.model_copy(update={"instances": {}}), CreateInstance(command_id="c", instance=INSTANCE), ["InstanceCreated"]),
        (STATE, CreateInstance(command_id="c", instance=INSTANCE), "instance_exists"),
        (State(), CreateInstance(command_id="c", instance=INSTANCE), "unknown_nodes"),
        (State(), EvictStagedModel(command_id="c", model_id="local/tiny-llama"), ["StagedModelEvicted"]),
        (State(), PlaceInstance(command_id="c", model_id="local/tiny-llama"), "unknown_model"),
        # a copy of a placement already made places nothing more (and needs no card)
        (STATE, PlaceInstance(command_id="c", model_id="local/tiny-llama", instance_id="i1"), []),
    ],
)
def test_decide(state, command, expected):
    assert kinds(decide(state, command, ids())) == expected


def test_delete_cancels_only_open_tasks_before_deleting():
    events = decide(STATE, DeleteInstance(command_id="c", instance_id="i1"), ids())
    assert isinstance(events[0], TaskStatusUpdated) and events[0].task_id == "t1" and events[0].status == "Cancelled"
    assert isinstance(events[-1], InstanceDeleted)


def test_event_types_are_the_decided_ones():
    assert isinstance(decide(State(), SetTracingEnabled(command_id="c", enabled=True), ids())[0], TracingStateChanged)
    assert isinstance(decide(State(), EvictStagedModel(command_id="c", model_id="a/b"), ids())[0], StagedModelEvicted)
    assert isinstance(decide(STATE.model_copy(update={"instances": {}}), CreateInstance(command_id="c", instance=INSTANCE), ids())[0], InstanceCreated)


# -- generation requests -----------------------------------------------------------------


PARAMS = TextGenerationParams(model_id="local/tiny-llama", messages=[ChatMessage(role="user", content="hi")])
SERVING = STATE.model_copy(update={"runners": {"r1": RunnerStatus(state="Ready")}, "tasks": {}})


def test_generate_binds_a_task_to_a_serving_instance_owned_by_the_origin():
    (event,) = decide(SERVING, GenerateText(command_id="g1", params=PARAMS), ids())
    assert isinstance(event, TaskCreated)
    task = event.task
    assert (task.instance_id, task.command_id, task.owner_node_id, task.status) == ("i1", "g1", "n1", "Pending")


def test_generate_for_an_unplaced_model_records_a_failed_task_naming_the_fix():
    (event,) = decide(State(), GenerateText(command_id="g1", params=PARAMS), ids())
    assert event.task.status == "Failed" and event.task.instance_id == UNPLACED_INSTANCE
    assert "place_instance" in event.task.error_message


def test_a_loading_instance_still_takes_requests_and_ready_ones_are_preferred():
    loading = STATE.model_copy(update={"tasks": {}})
    assert ready_instance_for(loading, "local/tiny-llama").instance_id == "i1"
    second = INSTANCE.model_copy(update={"instance_id": "i0", "shards": [INSTANCE.shards[0].model_copy(update={"runner_id": "r0"})]})
    both = SERVING.model_copy(update={"instances": {"i0": second, "i1": INSTANCE}})
    assert ready_instance_for(both, "local/tiny-llama").instance_id == "i1"  # r0 has no status: not serving


def test_finished_and_cancelled_commands_clean_their_tasks_up():
    task = TextGeneration(owner_node_id="n1", task_id="t5", instance_id="i1", command_id="g1", params=PARAMS)
    state = SERVING.model_copy(update={"tasks": {"t5": task}})
    assert kinds(decide(state, TaskFinished(command_id="c", finished_command_id="g1"), ids())) == ["TaskDeleted"]
    assert kinds(decide(state, CancelCommand(command_id="c", cancelled_command_id="g1"), ids())) == [
        "TaskStatusUpdated", "TaskDeleted",
    ]
    done = state.model_copy(update={"tasks": {"t5": task.model_copy(update={"status": "Failed"})}})
    assert kinds(decide(done, CancelCommand(command_id="c", cancelled_command_id="g1"), ids())) == ["TaskDeleted"]
    assert decide(state, CancelCommand(command_id="c", cancelled_command_id="other"), ids()) == []
    assert isinstance(decide(state, TaskFinished(command_id="c", finished_command_id="g1"), ids())[0], TaskDeleted)


@pytest.mark.parametrize(
    ("state", "status", "instance_id"),
    [(SERVING, "Pending", "i1"), (State(), "Failed", UNPLACED_INSTANCE)],
)
def test_embed_binds_like_generate(state, status, instance_id):
    from skulk.shared.types.commands import RunWorkload

    params = EmbeddingParams(model_id="local/tiny-llama", inputs=["hello"])
    (event,) = decide(state, RunWorkload(command_id="e1", params=params), ids())
    task = event.task
    assert isinstance(task, WorkloadTask)
    assert (task.instance_id, task.command_id, task.owner_node_id, task.status) == (instance_id, "e1", "n1", status)
    assert task.params == params
    if status == "Failed":
        assert "place_instance" in task.error_message


@pytest.mark.parametrize(
    ("runner", "bound"),
    [("Ready", "i1"), ("Loading", "i1"), (None, "i1"), ("Failed", UNPLACED_INSTANCE), ("Shutdown", UNPLACED_INSTANCE)],
)
def test_a_request_never_binds_to_an_instance_whose_runner_is_down(runner, bound):
    runners = {} if runner is None else {"r1": RunnerStatus(state=runner, error_message="engine crashed")}
    state = STATE.model_copy(update={"runners": runners, "tasks": {}})
    (event,) = decide(state, GenerateText(command_id="g1", params=PARAMS), ids())
    assert event.task.instance_id == bound
    if bound == UNPLACED_INSTANCE:  # born failed at once, naming the runner, its state and reason
        assert event.task.status == "Failed"
        assert f"runner r1 on node n1 is {runner}" in event.task.error_message


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        ({}, ["TaskCreated"]),  # the first copy binds
        ({"t5": "Pending"}, []),  # a resent copy that crossed the original binds nothing
        ({"t5": "Running"}, []),
        ({"t5": "Failed"}, []),  # born failed (unplaced): the owner already has its answer
    ],
)
def test_a_command_is_bound_once_however_often_it_is_published(existing, expected):
    tasks = {t: TextGeneration(owner_node_id="n1", task_id=t, instance_id="i1", command_id="g1", params=PARAMS,
                               status=status) for t, status in existing.items()}
    state = SERVING.model_copy(update={"tasks": tasks})
    assert kinds(decide(state, GenerateText(command_id="g1", params=PARAMS), ids())) == expected
    from skulk.shared.types.commands import RunWorkload

    embedding = WorkloadTask(owner_node_id="n1", task_id="t6", instance_id="i1", command_id="e1",
                          params=EmbeddingParams(model_id="local/tiny-llama", inputs=["x"]))
    with_embedding = SERVING.model_copy(update={"tasks": {"t6": embedding}})
    assert decide(with_embedding, RunWorkload(command_id="e1", params=embedding.params), ids()) == []
