"""The generated tiny GGUF model and the typed objects around it, for engine and runner
tests. Import the fixtures into a test module: `from tests.worker.tiny_gguf import tiny_gguf`."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.tasks import TextGeneration, TextGenerationParams

TINY_GGUF_MODEL_ID = "local/tiny-llama-gguf"
NODE = NodeId("node-test")
OWNER = NodeId("node-owner")
RUNNER = RunnerId("runner-0")
INSTANCE = InstanceId("instance-0")


def tiny_gguf_card() -> ModelCard:
    return load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")


def tiny_instance(
    card: ModelCard, *, context_token_limit: int = 2048, backend: str = "llama_cpp-cpu", slots: int = 1
) -> Instance:
    return Instance(
        instance_id=INSTANCE,
        model_id=ModelId(card.model_id),
        sharding="Pipeline",
        shards=[
            ShardAssignment(
                node_id=NODE, runner_id=RUNNER, rank=0, world_size=1,
                start_layer=0, end_layer=card.num_layers, backend=backend, slots=slots,
            )
        ],
        context_token_limit=context_token_limit,
    )


LONG_PROMPT = "the the the the"
"""A prompt the tiny model continues greedily for at least LONG_TOKENS tokens without choosing
an end-of-generation token (most prompts end on their own after a few hundred). Tests that
must act mid-stream use it; `test_long_prompt_really_is_long` guards the assumption."""
LONG_TOKENS = 1800


def text_task(name: str, params: TextGenerationParams) -> TextGeneration:
    return TextGeneration(
        task_id=TaskId(f"task-{name}"),
        instance_id=INSTANCE,
        command_id=CommandId(f"cmd-{name}"),
        owner_node_id=OWNER,
        params=params,
    )


def prompt_params(prompt: str, **kwargs) -> TextGenerationParams:
    return TextGenerationParams(model_id=ModelId(TINY_GGUF_MODEL_ID), prompt=prompt, **kwargs)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """Path of the generated tiny GGUF (generated once per test session)."""
    from skulk.artifacts.resolve import ensure_local_model

    path = ensure_local_model(tiny_gguf_card(), tmp_path_factory.mktemp("models"))
    assert path.suffix == ".gguf" and path.is_file(), path
    return path


THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
)
"""A reasoning model's template (DeepSeek-R1 style: the template opens the think block; Qwen 3's
`enable_thinking` closes it empty). The tiny model never writes `</think>`, so with it the
tiny model reasons until its output is cut."""


def with_chat_template(source: Path, dest: Path, template: str) -> Path:
    """A copy of the GGUF `source` at `dest` whose chat template is `template` (weights and
    every other key unchanged), written with the gguf package's own metadata copier."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(source, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dest, arch=arch, endianess=reader.endianess)
    template_key = gguf.Keys.Tokenizer.CHAT_TEMPLATE
    copy_with_new_metadata(reader, writer, {template_key: MetadataDetails(gguf.GGUFValueType.STRING, template)}, [])
    return dest
