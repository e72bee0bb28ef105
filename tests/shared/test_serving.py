"""Which placed instances of a model can take a request: serving, loading, or down."""

from __future__ import annotations

import pytest

from skulk.shared.serving import model_serving, runner_serving, serving
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State

MODEL = "m"


def _instance(instance_id: str, runners: list[str], model: str = MODEL) -> Instance:
    n = len(runners)
    return Instance(
        instance_id=instance_id, model_id=model, sharding="Pipeline", context_token_limit=1024,
        shards=[ShardAssignment(node_id=f"node-{r}", runner_id=r, rank=i, world_size=n, start_layer=i,
                                end_layer=i + 1, backend="cpu") for i, r in enumerate(runners)],
    )


def _state(instances: dict[str, list[str]], runners: dict[str, tuple[str, str | None]]) -> State:
    return State(
        instances={i: _instance(i, rs) for i, rs in instances.items()},
        runners={r: RunnerStatus(state=s, error_message=why) for r, (s, why) in runners.items()},
    )


@pytest.mark.parametrize(
    ("instances", "runners", "serving", "loading", "down", "refused"),
    [
        ({}, {}, [], [], [], False),  # not placed: not ours to refuse (the 404 path)
        ({"i1": ["r1"]}, {"r1": ("Ready", None)}, ["i1"], [], [], False),
        ({"i1": ["r1"]}, {"r1": ("Running", None)}, ["i1"], [], [], False),
        ({"i1": ["r1"]}, {}, [], ["i1"], [], False),  # runner not created yet: coming up
        ({"i1": ["r1"]}, {"r1": ("Loading", None)}, [], ["i1"], [], False),
        ({"i1": ["r1"]}, {"r1": ("Failed", "out of memory")}, [], [], ["r1"], True),
        ({"i1": ["r1"]}, {"r1": ("ShuttingDown", None)}, [], [], ["r1"], True),
        # a group with one rank failed is down even while the other rank is Ready
        ({"i1": ["r1", "r2"]}, {"r1": ("Ready", None), "r2": ("Failed", "ring broke")}, [], [], ["r2"], True),
        # one instance down, another loading: wait for the load
        ({"i1": ["r1"], "i2": ["r2"]}, {"r1": ("Failed", "x"), "r2": ("Loading", None)}, [], ["i2"], ["r1"], False),
        ({"i1": ["r1"], "i2": ["r2"]}, {"r1": ("Failed", "x"), "r2": ("Ready", None)}, ["i2"], [], ["r1"], False),
    ],
)
def test_model_serving_classifies_each_instance(instances, runners, serving, loading, down, refused) -> None:
    verdict = model_serving(_state(instances, runners), MODEL)
    assert [i.instance_id for i in verdict.serving] == serving
    assert [i.instance_id for i in verdict.loading] == loading
    assert [d.runner_id for d in verdict.down] == down
    assert verdict.refused is refused


def test_other_models_are_not_counted() -> None:
    state = State(instances={"i1": _instance("i1", ["r1"], model="other")}, runners={"r1": RunnerStatus(state="Ready")})
    assert not model_serving(state, MODEL).placed


def test_refusal_names_the_runner_node_state_and_reason() -> None:
    verdict = model_serving(_state({"i1": ["r1"]}, {"r1": ("Failed", "engine crashed: SIGSEGV")}), MODEL)
    message = verdict.refusal()
    assert "runner r1 on node node-r1 is Failed (engine crashed: SIGSEGV)" in message
    assert message.startswith(f"{MODEL} has no serving runner")


def test_a_waiting_request_is_explained_by_its_runners_states() -> None:
    from skulk.shared.serving import wait_explanation
    from skulk.shared.types.tasks import TextGeneration, TextGenerationParams

    task = TextGeneration(owner_node_id="api", task_id="t1", instance_id="i1", command_id="c1",
                          params=TextGenerationParams(model_id=MODEL, prompt="x"))
    state = _state({"i1": ["r1"]}, {"r1": ("Loading", None)}).model_copy(update={"tasks": {"t1": task}})
    assert wait_explanation(state, "c1") == "runner r1 on node node-r1 is Loading"
    assert wait_explanation(state.model_copy(update={"runners": {}}), "c1") == "runner r1 on node node-r1 is not started yet"
    assert "never logged" in wait_explanation(state, "other")


@pytest.mark.parametrize(
    ("runners", "expected"),
    [
        ({"r1": ("Ready", None), "r2": ("Running", None)}, True),
        ({"r1": ("Ready", None)}, False),  # a rank that never reported is not serving
        ({"r1": ("Ready", None), "r2": ("Loading", None)}, False),
        ({"r1": ("Ready", None), "r2": ("Failed", "x")}, False),
        ({"r1": ("ShuttingDown", None), "r2": ("Ready", None)}, False),
    ],
)
def test_serving_needs_every_runner_serving(runners, expected) -> None:
    state = _state({"i1": ["r1", "r2"]}, runners)
    assert serving(state, state.instances["i1"]) is expected


@pytest.mark.parametrize(("status", "expected"), [
    (None, False), (RunnerStatus(state="Ready"), True), (RunnerStatus(state="Running"), True),
    (RunnerStatus(state="WarmingUp"), False), (RunnerStatus(state="Failed"), False),
])
def test_runner_serving(status, expected) -> None:
    assert runner_serving(status) is expected
