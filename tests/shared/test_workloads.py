"""The workload table holds together: every row's types carry its kind, every workload is
served by at least one engine, every engine that claims a workload is one the runner can
construct and has the method the row names, and a row's redaction leaves no caller text."""

from __future__ import annotations

import base64
import importlib

import pytest

from skulk.shared.codec import pack, unpack
from skulk.shared.types.common import ChatMessage, ToolSpec
from skulk.shared.types.engines import ENGINE_TRAITS
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.tasks import ResponseFormat, TextGenerationParams
from skulk.shared.types.workload_io import EchoParams, EmbeddingParams, SpeechParams, TranscriptionParams
from skulk.shared.types.workloads import WORKLOADS, card_workloads, workload_of
from skulk.worker.runner.bootstrap import ENGINES

SECRET = "the caller's secret words"

ENGINE_CLASSES = {
    "llama_cpp": ("skulk.worker.engines.llama_cpp.engine", "LlamaCppEngine"),
    "llama_server": ("skulk.worker.engines.served.llama_server", "LlamaServerEngine"),
    "vllm": ("skulk.worker.engines.served.vllm", "VllmEngine"),
    "mlx": ("skulk.worker.engines.mlx.engine", "MlxEngine"),
    "faster_whisper": ("skulk.worker.engines.speech.whisper", "WhisperEngine"),
    "mlx_whisper": ("skulk.worker.engines.speech.mlx_whisper_engine", "MlxWhisperEngine"),
    "piper": ("skulk.worker.engines.speech.piper_voice", "PiperEngine"),
}
"""The class each runner constructor builds (`bootstrap.ENGINES`), to check its methods."""

SAMPLES = {
    "text": TextGenerationParams(
        model_id="m", messages=[ChatMessage(role="user", content=SECRET)], stop=[SECRET],
        tools=[ToolSpec(name="t", description=SECRET, parameters={"type": "object"})],
        response_format=ResponseFormat(type="json_schema", json_schema={"title": SECRET})),
    "embeddings": EmbeddingParams(model_id="m", inputs=[SECRET, SECRET]),
    "echo": EchoParams(model_id="m", text=SECRET),
    "transcription": TranscriptionParams.of_audio("m", SECRET.encode(), prompt=SECRET),
    "speech": SpeechParams(model_id="m", input=SECRET, voice="v"),
}
"""One request of every workload, full of caller text."""


def test_every_workload_has_a_sample():
    assert set(SAMPLES) == set(WORKLOADS)


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_a_row_types_carry_its_kind(kind):
    row = WORKLOADS[kind]
    assert row.kind == kind and workload_of(SAMPLES[kind]) is row
    assert isinstance(SAMPLES[kind], row.params)
    served = row.serve is not None or row.serve_stream is not None
    assert (row.result is None) == (not served), "a one-result workload says how it is served"
    if row.result is not None:
        assert row.result.model_fields["workload"].default == kind


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_a_workload_is_served_by_an_engine_that_has_its_method(kind):
    row = WORKLOADS[kind]
    engines = [name for name, traits in ENGINE_TRAITS.items() if kind in traits.workloads]
    assert engines, f"no engine serves {kind}"
    for name in engines:
        module, cls = ENGINE_CLASSES[name]
        try:
            engine_class = getattr(importlib.import_module(module), cls)
        except ImportError as exc:  # an engine library this machine lacks (MLX off Apple/Linux)
            pytest.skip(f"{name}: {exc}")
        assert callable(getattr(engine_class, row.engine_method, None)), f"{name} lacks {row.engine_method}"


def test_every_traits_row_that_serves_work_has_a_constructor():
    serving = {name for name, traits in ENGINE_TRAITS.items() if traits.workloads}
    assert serving == set(ENGINES) == set(ENGINE_CLASSES)
    assert all(traits.workloads <= set(WORKLOADS) for traits in ENGINE_TRAITS.values())


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_redaction_leaves_no_caller_text_and_keeps_the_shape(kind):
    params = SAMPLES[kind]
    redacted = WORKLOADS[kind].redact(params)
    assert SECRET not in str(redacted.to_wire())
    assert base64.b64encode(SECRET.encode()).decode() not in str(redacted.to_wire())
    assert type(redacted) is type(params) and redacted.model_id == params.model_id
    assert type(redacted).model_validate(redacted.to_wire()) == redacted  # still a valid request


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_a_task_input_carries_any_workload_across_the_wire(kind):
    item = TaskInput(command_id="c1", params=SAMPLES[kind])
    assert unpack(TaskInput, pack(item)) == item


@pytest.mark.parametrize(("tasks", "workloads"), [
    (("TextGeneration",), {"text"}),
    (("Embedding",), {"embeddings"}),
    (("TextGeneration", "Embedding"), {"text", "embeddings"}),
    (("Transcription",), {"transcription"}),
    (("SpeechSynthesis",), {"speech"}),
    ((), set()),
])
def test_a_card_promises_the_workloads_of_its_tasks(tasks, workloads):
    assert card_workloads(tasks) == workloads
