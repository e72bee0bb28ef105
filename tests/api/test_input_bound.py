"""The API refuses an input over the per-command transfer bound before anything is
submitted: a 413 named `input_too_large`, its stream closed and nothing held for the relay
(`skulk.api.generation.hold_input`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from skulk.api.errors import PayloadTooLarge
from skulk.api.generation import hold_input
from skulk.shared.input_transfer import MAX_COMMAND_INPUT_BYTES
from skulk.shared.types.ids import CommandId, ModelId
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.workload_io import EchoParams, TranscriptionParams


@dataclass
class Held:
    items: list[TaskInput] = field(default_factory=list)

    def hold_input(self, item: TaskInput) -> None:
        self.items.append(item)


@dataclass
class Stream:
    closed: bool = False

    def close(self) -> bool:
        self.closed = True
        return True


def test_an_input_within_the_bound_is_held():
    context, stream = Held(), Stream()
    item = TaskInput(command_id=CommandId("c1"), params=EchoParams(model_id=ModelId("m"), text="hi"))
    hold_input(context, stream, item)  # pyright: ignore[reportArgumentType]
    assert context.items == [item] and not stream.closed


def test_an_input_over_the_bound_is_a_413_before_anything_is_held():
    over = TranscriptionParams.model_construct(model_id=ModelId("m"), audio_b64="A" * MAX_COMMAND_INPUT_BYTES,
                                               audio_sha256="0" * 64, workload="transcription")
    context, stream = Held(), Stream()
    with pytest.raises(PayloadTooLarge) as refused:
        hold_input(context, stream, TaskInput.model_construct(command_id=CommandId("c1"), params=over))  # pyright: ignore[reportArgumentType]
    assert refused.value.code == "input_too_large" and str(MAX_COMMAND_INPUT_BYTES) in refused.value.message
    assert stream.closed and context.items == []
