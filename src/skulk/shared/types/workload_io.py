"""What each one-result workload takes and gives back: its params and its result.

Text generation streams tokens (`TextGenerationParams` in, `TokenChunk`s out); every other
workload so far answers a request with one result (`ResultChunk` carries it). Their wire
types live here, each params model tagged by `workload` and each result by `workload`, so
the unions below are what every layer carries: a command (`RunWorkload`), a task
(`WorkloadTask`), a task input, a runner request and a result chunk. The table that says
how each is served and shown is `skulk.shared.types.workloads`.

A new one-result workload adds its params and result here (and one member to each union),
a row in that table, the engine method that serves it, and the engines that do
(`skulk.shared.types.engines`): nothing else in the worker, runner or API changes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import FiniteFloat
from skulk.shared.types.ids import ModelId

MAX_ECHO_CHARS = 65536
"""The echo workload's bound on its text (a diagnostic, not a document reader)."""


class EmbeddingParams(WireModel):
    """A normalised embedding request: text `inputs`, or `token_inputs` (token id lists,
    embedded as given), never both. One vector per input, in order."""

    workload: Literal["embeddings"] = "embeddings"
    model_id: ModelId
    inputs: list[str] = Field(default_factory=list)
    dimensions: int | None = Field(default=None, ge=1)
    token_inputs: list[list[int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_input_kind(self) -> EmbeddingParams:
        if bool(self.inputs) == bool(self.token_inputs):
            raise ValueError("exactly one of `inputs` or `token_inputs` (non-empty) is required")
        if any(not tokens for tokens in self.token_inputs):
            raise ValueError("every `token_inputs` item must hold at least one token id")
        return self

    @property
    def embedding_inputs(self) -> list[str] | list[list[int]]:
        """The inputs to embed, whichever kind was given."""
        return self.token_inputs or self.inputs

    def redacted(self) -> EmbeddingParams:
        """These params without the texts or token ids to embed (their count stays)."""
        return self.model_copy(update={"inputs": ["" for _ in self.inputs],
                                       "token_inputs": [[0] for _ in self.token_inputs]})


class EmbeddingResult(WireModel):
    """One vector per input, in the inputs' order."""

    workload: Literal["embeddings"] = "embeddings"
    embeddings: list[list[FiniteFloat]]


class EchoParams(WireModel):
    """The echo workload: `text` read back through the placed model's tokenizer. It proves
    the workload table end to end (a request reaches a real runner and its engine, and one
    result comes back), and shows how a model tokenizes a text."""

    workload: Literal["echo"] = "echo"
    model_id: ModelId
    text: str = Field(max_length=MAX_ECHO_CHARS)

    def redacted(self) -> EchoParams:
        """These params without the text."""
        return self.model_copy(update={"text": ""})


class EchoResult(WireModel):
    """`text` as the engine detokenizes its own `tokens` of it."""

    workload: Literal["echo"] = "echo"
    text: str
    tokens: list[int]


OneResultParams = Annotated[EmbeddingParams | EchoParams, Field(discriminator="workload")]
"""The params of every workload that answers with one result."""

WorkloadResult = Annotated[EmbeddingResult | EchoResult, Field(discriminator="workload")]
"""Every one-result workload's result."""

__all__ = [
    "MAX_ECHO_CHARS",
    "EchoParams",
    "EchoResult",
    "EmbeddingParams",
    "EmbeddingResult",
    "OneResultParams",
    "WorkloadResult",
]
