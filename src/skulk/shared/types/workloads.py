"""The kinds of work a cluster serves, one row each: what a workload takes, what it gives
back, what the master may see of it, which engine capability serves it, and how.

Everything that moves a request through the cluster reads a row here instead of asking
"is this an embedding?": the API submits a one-result workload as `RunWorkload` and
collects its one `ResultChunk` (`skulk.api.workload_results`), the master binds it to an
instance as a `WorkloadTask`, the worker hands its input (`TaskInput`, keyed by the params'
`workload` tag) to the runner, and the runner's dispatcher calls the engine method the row
names (`skulk.worker.engines.base`). Which engines serve which workloads is the engine
traits table's `workloads` (`skulk.shared.types.engines`); a test ties each row to an
engine that has its method, and each engine that claims a workload to the method.

Text generation is a row too, but a richer one: it streams tokens, may ask for several
choices, holds sessions and traces, so it keeps its own command (`GenerateText`), task
(`TextGeneration`) and API handle (`skulk.api.generation_handle`). Pure data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from skulk.shared.types.cards import ModelTask
from skulk.shared.types.chunks import ResultChunk, TokenChunk
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import (
    EchoParams,
    EchoResult,
    EmbeddingParams,
    EmbeddingResult,
    SpeechParams,
    SpeechResult,
    TranscriptionParams,
    TranscriptionResult,
)

Served = tuple[Any, int]
"""What serving a one-result workload yields: its result and the prompt tokens it read."""

ServedStream = Iterator[Served]
"""What serving a workload that answers in several results yields: each result, in order,
with the prompt tokens read so far; the last result is the final one."""


@dataclass(frozen=True)
class Workload:
    """One kind of work.

    `params`: the normalised request model (its `workload` tag is `kind`). `chunk`: the
    output chunk type its stream carries. `result`: the one result model (None: a token
    stream). `redact`: what the master may see of a request (State and the event log never
    hold caller text). `card_task`: the task a model's card lists when the model is for this
    work (None: any placed model may serve it, where its engine can).
    `engine_method`: the engine method that serves it (the capability an engine needs).
    `serve`: for a one-result workload, how the dispatcher calls that method with the
    params and turns what it returns into (result, prompt tokens). `serve_stream`: for a
    workload that may answer in several results (a transcript segment by segment, speech
    sentence by sentence), how the dispatcher calls the method and iterates what it yields;
    the dispatcher checks for a cancel between results and closes the iterator on one.
    `meaning`: one line for operators and errors."""

    kind: str
    params: type[Any]
    chunk: type[TokenChunk] | type[ResultChunk]
    result: type[Any] | None
    redact: Callable[[Any], Any]
    card_task: ModelTask | None
    engine_method: str
    meaning: str
    serve: Callable[[Callable[..., Any], Any], Served] | None = None
    serve_stream: Callable[[Callable[..., Any], Any], ServedStream] | None = None


def _serve_embeddings(embed: Callable[..., Any], params: EmbeddingParams) -> Served:
    vectors, prompt_tokens = embed(params.embedding_inputs, params.dimensions)
    return EmbeddingResult(embeddings=vectors), prompt_tokens


def _serve_echo(echo: Callable[..., Any], params: EchoParams) -> Served:
    tokens, text = echo(params.text)
    return EchoResult(text=text, tokens=list(tokens)), len(tokens)


def _serve_transcription(transcribe: Callable[..., Any], params: TranscriptionParams) -> ServedStream:
    """The engine's `transcribe(params)` yields `TranscriptionResult`s (partial ones while
    streaming, then one final); a transcript reads no prompt tokens."""
    for result in transcribe(params):
        yield result, 0


def _serve_speech(synthesize: Callable[..., Any], params: SpeechParams) -> ServedStream:
    """The engine's `synthesize(params)` yields `SpeechResult`s, one per sentence, the last
    final; the prompt is the input's characters (a voice has no token count to report)."""
    for result in synthesize(params):
        yield result, len(params.input)


WORKLOADS: Mapping[str, Workload] = MappingProxyType({
    "text": Workload(
        kind="text", params=TextGenerationParams, chunk=TokenChunk, result=None,
        redact=TextGenerationParams.redacted, card_task="TextGeneration", engine_method="generate",
        meaning="text generation: chat and completions, streamed token by token",
    ),
    "embeddings": Workload(
        kind="embeddings", params=EmbeddingParams, chunk=ResultChunk, result=EmbeddingResult,
        redact=EmbeddingParams.redacted, card_task="Embedding", engine_method="embed",
        meaning="embeddings: one vector per input text", serve=_serve_embeddings,
    ),
    "echo": Workload(
        kind="echo", params=EchoParams, chunk=ResultChunk, result=EchoResult,
        redact=EchoParams.redacted, card_task=None, engine_method="echo",
        meaning="echo: a text read back through the placed model's tokenizer (its token ids)",
        serve=_serve_echo,
    ),
    "transcription": Workload(
        kind="transcription", params=TranscriptionParams, chunk=ResultChunk, result=TranscriptionResult,
        redact=TranscriptionParams.redacted, card_task="Transcription", engine_method="transcribe",
        meaning="speech to text: an audio file transcribed (or translated to English), whole or segment by segment",
        serve_stream=_serve_transcription,
    ),
    "speech": Workload(
        kind="speech", params=SpeechParams, chunk=ResultChunk, result=SpeechResult,
        redact=SpeechParams.redacted, card_task="SpeechSynthesis", engine_method="synthesize",
        meaning="text to speech: a text spoken in a voice, whole or sentence by sentence",
        serve_stream=_serve_speech,
    ),
})
"""Every workload, by its `kind` (the `workload` tag of its params and result)."""

def workload_of(params: Any) -> Workload:
    """The row of a params model (by its `workload` tag)."""
    return WORKLOADS[params.workload]


def card_workloads(tasks: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The workloads a card's `tasks` promise: an engine that serves its model must serve
    each of them."""
    return frozenset(kind for kind, row in WORKLOADS.items() if row.card_task in tasks)


__all__ = ["WORKLOADS", "Served", "ServedStream", "Workload", "card_workloads", "workload_of"]
