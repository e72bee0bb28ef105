"""The worker <-> runner messages survive the trip through a multiprocessing queue."""

from __future__ import annotations

import pickle

import pytest

from skulk.shared.types.chunks import StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.shared.types.common import Usage
from skulk.shared.types.ids import CommandId, TaskId
from skulk.shared.types.instances import RunnerStatus
from skulk.worker.runner.messages import (
    FROM_RUNNER_ADAPTER,
    TO_RUNNER_ADAPTER,
    Cancel,
    Frame,
    Generate,
    LoadShard,
    ShutdownRunner,
    StatusChanged,
    TaskAccepted,
    TaskDone,
    pack,
    pack_token,
    unpack,
)
from tests.worker.tiny_gguf import OWNER, RUNNER, prompt_params, text_task, tiny_gguf_card, tiny_instance

CMD = CommandId("cmd-x")

TO_RUNNER = [
    LoadShard(
        instance=tiny_instance(tiny_gguf_card()), runner_id=RUNNER, card=tiny_gguf_card(),
        model_path="/models/model.gguf", n_threads=4,
    ),
    Generate(task=text_task("x", prompt_params("hi", max_tokens=3, stop=["\n"]))),
    Cancel(task_id=TaskId("task-x")),
    ShutdownRunner(),
]
FROM_RUNNER = [
    StatusChanged(status=RunnerStatus(state="Failed", error_message="boom"), in_flight=2),
    TaskAccepted(task_id=TaskId("task-x")),
    Frame(owner_node_id=OWNER, frame=StreamStarted(command_id=CMD, runner_id=RUNNER)),
    Frame(
        owner_node_id=OWNER,
        frame=StreamPayload(
            command_id=CMD, seq=1,
            chunk=TokenChunk(command_id=CMD, text="a", token_id=7, finish_reason="length",
                             usage=Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)),
        ),
    ),
    Frame(
        owner_node_id=OWNER,
        frame=StreamTerminal(command_id=CMD, seq=2, outcome="failed", error_type="RunnerCrashed"),
    ),
    TaskDone(task_id=TaskId("task-x"), outcome="cancelled"),
]


@pytest.mark.parametrize("message", TO_RUNNER + FROM_RUNNER, ids=lambda m: m.type)
def test_messages_pickle_and_round_trip_the_wire(message) -> None:
    assert pickle.loads(pickle.dumps(message)) == message
    adapter = TO_RUNNER_ADAPTER if message in TO_RUNNER else FROM_RUNNER_ADAPTER
    assert adapter.validate_python(message.to_wire()) == message


def test_load_shard_refuses_a_zero_thread_count() -> None:
    with pytest.raises(ValueError):
        LoadShard(
            instance=tiny_instance(tiny_gguf_card()), runner_id=RUNNER, card=tiny_gguf_card(),
            model_path="/m.gguf", n_threads=0,
        )


@pytest.mark.parametrize("message", FROM_RUNNER, ids=lambda m: m.type)
def test_runner_output_survives_the_pipe_encoding(message) -> None:
    assert unpack(pack(message)) == message


@pytest.mark.parametrize(
    ("finish_reason", "usage"),
    [(None, None), ("length", Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)), ("stop", None),
     ("stop", Usage(prompt_tokens=30, completion_tokens=1, total_tokens=31, cached_tokens=20))],
)
def test_a_plain_token_frame_unpacks_to_the_frame_the_runner_meant(finish_reason, usage) -> None:
    expected = Frame(
        owner_node_id=OWNER,
        frame=StreamPayload(
            command_id=CMD, seq=5,
            chunk=TokenChunk(command_id=CMD, text="é", token_id=9, finish_reason=finish_reason, usage=usage),
        ),
    )
    got = unpack(pack_token(OWNER, CMD, 5, "é", 9, finish_reason, usage))
    assert got == expected
    assert got.to_wire() == expected.to_wire()
    # What `model_construct` would have set, to the fields set (exclude_unset dumps).
    assert got.frame.chunk.model_fields_set == {"command_id", "text", "token_id", "finish_reason", "usage"}
    assert (got.model_fields_set, got.frame.model_fields_set) == (
        {"owner_node_id", "frame"}, {"command_id", "seq", "chunk"})
    assert FROM_RUNNER_ADAPTER.validate_python(got.to_wire()) == expected
