"""A request's command is published again until its task is logged (`skulk.cluster.command_resend`)."""

from __future__ import annotations

import pytest

from skulk.cluster.command_resend import COMMAND_RESEND_S, CommandResender, ResendPlan, logged_commands, resend_plan
from skulk.shared.types.commands import GenerateText, PlaceInstance
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams

PARAMS = TextGenerationParams(model_id="m", messages=[ChatMessage(role="user", content="hi")])


def _task(command_id: str) -> TextGeneration:
    return TextGeneration(owner_node_id="n1", task_id=f"t-{command_id}", instance_id="i1", command_id=command_id,
                          params=PARAMS)


@pytest.mark.parametrize(
    ("sent_at", "logged", "waiting", "now", "expected"),
    [
        ({}, set(), set(), 10.0, ResendPlan()),
        # published just now: give the master its moment
        ({"c": 9.0}, set(), {"c"}, 10.0, ResendPlan()),
        # still no task after the interval: publish again
        ({"c": 10.0 - COMMAND_RESEND_S}, set(), {"c"}, 10.0, ResendPlan(resend=("c",))),
        # its task is logged: not sent, but kept while the stream waits (a new master's
        # snapshot may lack the task)
        ({"c": 0.0}, {"c"}, {"c"}, 10.0, ResendPlan()),
        # its stream started (a runner took it) or ended: never published again
        ({"c": 0.0}, set(), set(), 10.0, ResendPlan(forget=("c",))),
        ({"c": 0.0}, {"c"}, set(), 10.0, ResendPlan(forget=("c",))),
        # several at once, each on its own
        ({"a": 0.0, "b": 9.5, "c": 0.0, "d": 0.0}, {"c"}, {"a", "b", "c"}, 10.0,
         ResendPlan(resend=("a",), forget=("d",))),
    ],
)
def test_resend_plan(sent_at, logged, waiting, now, expected):
    assert resend_plan(sent_at, frozenset(logged), frozenset(waiting), now) == expected


def test_logged_commands_are_those_with_a_task():
    assert logged_commands(State(tasks={"t-a": _task("a")})) == {"a"}
    assert logged_commands(State()) == frozenset()


def test_the_resender_publishes_a_lost_command_until_its_task_appears():
    now = [0.0]
    sent = []
    resender = CommandResender(clock=lambda: now[0])
    command = GenerateText(command_id="g1", params=PARAMS)
    resender.published(command)
    resender.published(PlaceInstance(command_id="p1", model_id="m"))  # opens no stream: not tracked
    assert resender.stats()["tracked"] == 1
    sent += resender.tick(State(), ["g1"])
    assert sent == []
    now[0] = COMMAND_RESEND_S
    sent += resender.tick(State(), ["g1"])
    now[0] = COMMAND_RESEND_S * 1.5  # the interval runs from the last copy, not the first
    sent += resender.tick(State(), ["g1"])
    assert sent == [command]
    now[0] = COMMAND_RESEND_S * 2
    sent += resender.tick(State(), ["g1"])
    assert sent == [command, command]
    now[0] = COMMAND_RESEND_S * 10
    sent += resender.tick(State(tasks={"t-g1": _task("g1")}), ["g1"])  # logged at last
    assert sent == [command, command]
    now[0] = COMMAND_RESEND_S * 20
    sent += resender.tick(State(), ["g1"])  # a new master's snapshot without the task: sent again
    assert sent == [command, command, command]
    sent += resender.tick(State(), [])  # the stream started
    assert resender.stats() == {"tracked": 0, "capacity": 512, "resent": 3, "dropped": 0}
