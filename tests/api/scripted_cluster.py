"""A scripted cluster for API tests that drive the app with the official SDKs in-process:
`submit_command` plays the master and a rank-0 runner, answering GenerateText with the
TokenChunks a test chose (e.g. a model's tool-call text, which the tiny test model cannot be
made to write) and RunWorkload with a ResultChunk."""

from __future__ import annotations

import asyncio

import httpx

from skulk.api.app import ApiContext, create_app
from skulk.api.streams import CommandStreams
from skulk.shared.codec import pack
from skulk.shared.types.chunks import (
    PromptTokenLogprob,
    ResultChunk,
    StreamPayload,
    StreamStarted,
    StreamTerminal,
    TokenChunk,
    TopLogprob,
)
from skulk.shared.types.commands import GenerateText, RunWorkload
from skulk.shared.types.common import Usage
from skulk.shared.types.workload_io import EchoResult, EmbeddingResult, TranscriptionResult, TranscriptSegment
from tests.api.test_openai_routes import STATE
from tests.speech_kit import wav_duration_s

USAGE = Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10)


class ScriptedCluster:
    def __init__(self, streams: CommandStreams, texts=(), *, finish="stop", logprobs=False,
                 vectors=None, fail: tuple[str, str] | None = None, fail_after_output: bool = False,
                 stop_sequence: str | None = None) -> None:
        self.streams = streams
        self.texts = texts if callable(texts) else list(texts)
        """The token texts every generation answers, or a callable of the request's params
        that returns them (a test that scripts a second generation differently)."""
        self.finish = finish
        self.logprobs = logprobs
        self.vectors = vectors or []
        self.fail = fail
        self.fail_after_output = fail_after_output
        """With `fail`: send the texts first, then fail (a runner that broke mid-stream)."""
        self.stop_sequence = stop_sequence
        """Reported on the last chunk, as an engine reports the stop string that matched."""
        self.commands: list = []
        self.inputs: dict = {}
        """Each request's full params, as the serving node receives them."""
        self._tasks: list[asyncio.Task] = []

    def hold_input(self, item) -> None:
        self.inputs[item.command_id] = item

    async def submit(self, command) -> None:
        pack(command)  # what the real transport does first: a command that cannot be framed fails here
        self.commands.append(command)
        if isinstance(command, (GenerateText, RunWorkload)):
            self._tasks.append(asyncio.create_task(self._run(command)))

    def all_params(self, kind=GenerateText) -> list:
        """The full params of every command of `kind`, in submission order."""
        return [self.inputs[c.command_id].params for c in self.commands if isinstance(c, kind)]

    def params(self, kind=GenerateText):
        """The full params of the first command of `kind` (what its runner receives)."""
        return self.inputs[next(c for c in self.commands if isinstance(c, kind)).command_id].params

    def _chunks(self, command) -> list:
        cid = command.command_id
        if isinstance(command, RunWorkload) and command.params.workload == "transcription":
            return self._transcript(cid)
        if isinstance(command, RunWorkload) and command.params.workload == "echo":
            text = self.inputs[cid].params.text
            return [ResultChunk(command_id=cid, result=EchoResult(text=text, tokens=list(range(len(text.split())))),
                                usage=Usage(prompt_tokens=len(text.split()), total_tokens=len(text.split())))]
        if isinstance(command, RunWorkload):
            tokens = sum(len(item.split()) if isinstance(item, str) else len(item)
                         for item in self.inputs[cid].params.embedding_inputs)
            # A callable answers per request (one vector per input, as a runner does); a list
            # is sent as is, so a test can script a runner that breaks the protocol.
            vectors = self.vectors(len(self.inputs[cid].params.embedding_inputs)) if callable(self.vectors) else self.vectors
            return [ResultChunk(command_id=cid, result=EmbeddingResult(embeddings=vectors),
                                   usage=Usage(prompt_tokens=tokens, total_tokens=tokens))]
        texts = self.texts(self.inputs[cid].params) if callable(self.texts) else self.texts
        last = len(texts) - 1
        chunks = [
            TokenChunk(command_id=cid, text=text, token_id=i,
                       logprob=-0.25 if self.logprobs else None,
                       top_logprobs=[{"token": text, "logprob": -0.25, "token_id": i}] if self.logprobs else None,
                       finish_reason=self.finish if i == last else None, usage=USAGE if i == last else None,
                       stop_sequence=self.stop_sequence if i == last else None,
                       prompt_tokens=USAGE.prompt_tokens if i == 0 else None)
            for i, text in enumerate(texts)
        ]
        prompt = self.inputs[cid].params.prompt
        if chunks and self.inputs[cid].params.prompt_logprobs and prompt:
            # As an engine scores a prompt: here each character is a token, the first unscored.
            chunks[0] = chunks[0].model_copy(update={"prompt_logprobs": [
                PromptTokenLogprob(token=ch, token_id=i, logprob=None if i == 0 else -1.0,
                                   top_logprobs=[] if i == 0 else [TopLogprob(token=ch, logprob=-1.0)])
                for i, ch in enumerate(prompt)]})
        return chunks

    def _transcript(self, cid) -> list:
        """A transcript of the scripted texts, one segment each (a second per segment):
        each segment as a partial result when the request streams, then the final one."""
        params = self.inputs[cid].params
        texts = list(self.texts) if not callable(self.texts) else list(self.texts(params))
        segments = [TranscriptSegment(id=i, start=float(i), end=float(i + 1), text=text) for i, text in enumerate(texts)]
        duration = wav_duration_s(params.audio_bytes())  # the scripted "engine" hears the WAV it was sent
        partial = [ResultChunk(command_id=cid, result=TranscriptionResult(text=s.text, segments=[s], language="en",
                                                                          duration=duration, final=False))
                   for s in segments] if params.stream else []
        final = TranscriptionResult(text="".join(texts).strip(), segments=segments, language="en", duration=duration)
        return [*partial, ResultChunk(command_id=cid, result=final)]

    async def _run(self, command) -> None:
        cid = command.command_id
        self.streams.deliver(StreamStarted(command_id=cid, runner_id="r1"))
        chunks = [] if self.fail and not self.fail_after_output else self._chunks(command)
        for seq, chunk in enumerate(chunks, start=1):
            await asyncio.sleep(0)
            self.streams.deliver(StreamPayload(command_id=cid, seq=seq, chunk=chunk))
        end = len(chunks) + 1
        if self.fail:
            self.streams.deliver(StreamTerminal(command_id=cid, seq=end, outcome="failed",
                                                error_type=self.fail[0], error_message=self.fail[1]))
        else:
            self.streams.deliver(StreamTerminal(command_id=cid, seq=end, outcome="completed"))


def scripted_app(texts=(), *, context_fields=None, state=STATE, **kwargs):
    streams = CommandStreams()
    cluster = ScriptedCluster(streams, texts, **kwargs)
    context = ApiContext(node_id="n1", node_name="one", get_state=lambda: state, get_master=lambda: ("n1", "s1"),
                         submit_command=cluster.submit, hold_input=cluster.hold_input, streams=streams, **(context_fields or {}))
    return create_app(context), cluster


def asgi_http(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
