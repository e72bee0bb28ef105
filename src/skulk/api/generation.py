"""The generation path every inference wire format shares: bind a normalised request to a
placed instance, open its command stream, submit `GenerateText` (or `RunWorkload`), and drive the
stream to its end, telling the cluster how it ended exactly once (`TaskFinished` when the
runner ended it, `CancelCommand` when this side or the client did). Token chunks are shaped
on the way (`skulk.api.output`: reasoning apart, tool calls assembled).

The routes of each wire format (OpenAI, Anthropic, Ollama) call into here after their
adapter has produced `TextGenerationParams`, and serialise what comes out. This module must
never know any wire format: errors leave it typed (`skulk.api.errors`) and are rendered by
the caller's shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Protocol, Self, TypeVar

from fastapi import Request

from skulk.api import media
from skulk.api.auth import current_principal
from skulk.api.context import ApiContext, api_context
from skulk.api.errors import (
    ApiError,
    ClusterNotReady,
    FeatureUnsupported,
    InvalidRequest,
    ModelNotFound,
    ModelNotServing,
    PayloadTooLarge,
    StreamFailed,
)
from skulk.api.image_fetch import fetch_request_images
from skulk.api.limits import context_error, generation_limits_error, workload_limits_error
from skulk.api.output import OutputShaper
from skulk.api.streams import CommandStream
from skulk.api.strict_tools import combined_usage, strict_retry_params
from skulk.api.thinking_budget import BudgetMeter, closing_text, continuation_params, continued_usage
from skulk.models.model_names import load_library, placed_model_id
from skulk.observe.structured_logs import bind_request_ids
from skulk.observe.traces import RequestTrace
from skulk.shared.codec import pack
from skulk.shared.input_transfer import MAX_COMMAND_INPUT_BYTES, encode_input
from skulk.shared.reasoning_switches import refusal as reasoning_refusal
from skulk.shared.serving import model_serving
from skulk.shared.types.cards import ModelCard, backend_engine
from skulk.shared.types.chunks import ResultChunk, TokenChunk
from skulk.shared.types.commands import CancelCommand, Command, GenerateText, RunWorkload, TaskFinished
from skulk.shared.types.common import Usage
from skulk.shared.types.engines import is_pipelined, missing_features, on_vision_path, serves_workload
from skulk.shared.types.ids import CommandId, ModelId, new_id
from skulk.shared.types.instances import Instance
from skulk.shared.types.speculative import request_refusal as speculative_request_refusal
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import EmbeddingParams, EmbeddingResult, OneResultParams
from skulk.shared.types.workloads import workload_of

logger = logging.getLogger(__name__)


class _ForAModel(Protocol):
    """Any workload's params: they name a model."""

    @property
    def model_id(self) -> ModelId: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self: ...


P = TypeVar("P", bound=_ForAModel)
R = TypeVar("R")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Keep proxies from buffering a streamed response (SSE or NDJSON)."""

_background: set[asyncio.Task[None]] = set()
"""Commands sent after a request ended, held until sent (the loop keeps only weak refs)."""


def send_later(context: ApiContext, command: Command) -> None:
    """Submit `command` without waiting. Used where the request is ending (or already
    cancelled), so an await could be cancelled before the command leaves."""

    async def send() -> None:
        try:
            await context.submit_command(command)
        except Exception as exc:  # the request is over; all that is left is to say so
            logger.warning("could not send %s for command %s: %s", command.type, _subject(command), exc)

    try:
        task = asyncio.get_running_loop().create_task(send())
    except RuntimeError:  # a response generator finalised while the loop shuts down
        logger.warning("could not send %s for command %s: no running loop", command.type, _subject(command))
        return
    _background.add(task)
    task.add_done_callback(_background.discard)


def _subject(command: Command) -> str:
    return getattr(command, "cancelled_command_id", None) or getattr(command, "finished_command_id", command.command_id)


def cancel_later(context: ApiContext, command_id: str) -> None:
    send_later(context, CancelCommand(command_id=CommandId(new_id()), cancelled_command_id=CommandId(command_id)))


def finished_later(context: ApiContext, command_id: str) -> None:
    send_later(context, TaskFinished(command_id=CommandId(new_id()), finished_command_id=CommandId(command_id)))


class ClientChannel(Protocol):
    """What a generation watches for its client going away: an HTTP request, or a WebSocket
    socket's stand-in (`SocketChannel`) answering `http.disconnect` once the socket closes."""

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]: ...


class SocketChannel:
    """A WebSocket's stand-in for an HTTP request (`ClientChannel`): its client goes away
    (`http.disconnect`) when the socket closes (`closed` is set)."""

    def __init__(self, closed: asyncio.Event) -> None:
        self._closed = closed

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]:
        async def wait_closed() -> dict[str, str]:
            await self._closed.wait()
            return {"type": "http.disconnect"}

        return wait_closed


async def _close_on_disconnect(request: ClientChannel, context: ApiContext, stream: CommandStream) -> None:
    """Wait for the client to go away; then close its stream and cancel the command."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break
    if stream.close():
        logger.info("command %s: client disconnected; cancelling", stream.command_id)
        cancel_later(context, stream.command_id)


async def _follow(
    request: ClientChannel, context: ApiContext, stream: CommandStream, kind: type[Any]
) -> AsyncGenerator[Any, None]:
    """The chunks of `stream` (all of type `kind`) until it ends, telling the cluster how it
    ended: TaskFinished after the runner's terminal, CancelCommand when this node or the
    client ended it. A chunk of another type ends the stream as a protocol violation."""
    watcher = asyncio.create_task(_close_on_disconnect(request, context, stream))
    try:
        async for chunk in stream:
            if not isinstance(chunk, kind):
                # Skipped; the stream now ends with the violation once what is queued is read.
                context.streams.fail(stream.command_id, StreamErrorType.PROTOCOL_VIOLATION,
                                     f"A {kind.__name__} stream carried a {chunk.type}.")
                continue
            yield chunk
        finished_later(context, stream.command_id)
    except StreamFailed as failure:
        if failure.origin == "runner":
            finished_later(context, stream.command_id)
        elif failure.origin == "api":
            cancel_later(context, stream.command_id)
        raise
    finally:
        watcher.cancel()
        if stream.close():  # left early (the response generator was closed): cancel
            cancel_later(context, stream.command_id)


async def drive(
    request: ClientChannel, context: ApiContext, stream: CommandStream, params: TextGenerationParams | None = None
) -> AsyncGenerator[TokenChunk, None]:
    """The token chunks of `stream` until it ends (see `_follow`). Callers wrap it in
    `contextlib.aclosing` so that leaving early cancels the command.

    With `params`, the chunks are shaped for the request (`skulk.api.output`): reasoning
    marked apart, tool calls assembled once the output is complete, and a strict tool's call
    that broke its schema generated again with that tool forced (`_strict_retry`)."""
    shaper = _shaper(context, params, stream.command_id) if params is not None else None
    meter = BudgetMeter(params.thinking_budget) if params is not None and params.thinking_budget else None
    async with aclosing(_follow(request, context, stream, TokenChunk)) as chunks:
        async for chunk in chunks:
            if shaper is None:
                yield chunk
                continue
            for shaped in shaper.push(chunk):
                yield shaped
            if meter is not None and meter.spent(chunk, shaper.in_reasoning):
                break  # the budget is spent: leaving the stream cancels the run
    if meter is not None and meter.cut:
        assert params is not None and shaper is not None  # a meter exists only for params
        async with aclosing(_past_budget(request, context, stream.command_id, params, shaper, meter)) as answer:
            async for shaped in answer:
                yield shaped
    if shaper is not None:
        for shaped in shaper.finish():
            yield shaped
        if shaper.violation is not None:
            assert params is not None  # a shaper exists only for params
            async with aclosing(_strict_retry(request, context, stream.command_id, params, shaper)) as retried:
                async for shaped in retried:
                    yield shaped


def _shaper(context: ApiContext, params: TextGenerationParams, command_id: str) -> OutputShaper:
    """The output shaper of a request: its model card's reasoning and tool-call formats."""
    card = context.get_cards().get(params.model_id)
    return OutputShaper(params, _call_id_factory(command_id), card.reasoning if card else None,
                        card.tooling.tool_call_format if card else None)


async def _strict_retry(request: ClientChannel, context: ApiContext, command_id: str, params: TextGenerationParams,
                        shaper: OutputShaper) -> AsyncGenerator[TokenChunk, None]:
    """The call of `shaper.violation`'s strict tool generated again under its grammar, as
    chunks of the original command (the client sees one answer, its usage both runs'). A
    schema the grammar cannot enforce, or a retry that breaks it again, is the typed error
    `tool_call_invalid`."""
    violation = shaper.violation
    assert violation is not None
    retry = strict_retry_params(params, violation)
    if retry is None:
        raise StreamFailed(StreamErrorType.TOOL_CALL_INVALID,
                           f"{violation.message()}; its schema is beyond what this server's grammar enforces, so "
                           "the call could not be generated again.", origin="api")
    logger.info("strict tool call broke its schema; generating it again forced", extra={
        "tool": violation.tool, "path": violation.path, "commandId": command_id})
    bind_instance(context, retry)
    stream = await _submit_generation(context, retry, CommandId(new_id()), None)
    retry_shaper = _shaper(context, retry, command_id)
    async with aclosing(_follow(request, context, stream, TokenChunk)) as chunks:
        async for chunk in chunks:
            for shaped in retry_shaper.push(chunk):
                yield _as_original(shaped, command_id, shaper)
    finished = retry_shaper.finish()
    if retry_shaper.violation is not None:
        raise StreamFailed(StreamErrorType.TOOL_CALL_INVALID, retry_shaper.violation.message(), origin="api")
    for shaped in finished:
        yield _as_original(shaped, command_id, shaper)


async def _past_budget(request: ClientChannel, context: ApiContext, command_id: str, params: TextGenerationParams,
                       shaper: OutputShaper, meter: BudgetMeter) -> AsyncGenerator[TokenChunk, None]:
    """The answer of a run whose reasoning was cut at its thinking budget
    (`skulk.api.thinking_budget`): the closing marker goes to the shaper (it ends the
    reasoning there), then a continuation runs and its chunks are shaped as the original
    command's, its usage counting both runs."""
    card = context.get_cards().get(params.model_id)
    close = closing_text(card.reasoning if card else None, meter.thought)
    logger.info("thinking budget spent; the model answers in a continuation", extra={
        "commandId": command_id, "budget": meter.budget, "outputTokens": meter.tokens})
    for shaped in shaper.push(TokenChunk(command_id=CommandId(command_id), text=close.strip())):
        yield shaped
    more = continuation_params(params, meter, close)
    bind_instance(context, more)
    stream = await _submit_generation(context, more, CommandId(new_id()), None)
    async with aclosing(_follow(request, context, stream, TokenChunk)) as chunks:
        async for chunk in chunks:
            original = chunk.model_copy(update={"command_id": command_id, "prompt_tokens": None,
                                                "usage": continued_usage(meter, chunk.usage)})
            for shaped in shaper.push(original):
                yield shaped


def _as_original(chunk: TokenChunk, command_id: str, first: OutputShaper) -> TokenChunk:
    """A retry's chunk as the original command's, its usage counting the first run too."""
    update: dict[str, object] = {"command_id": command_id}
    if chunk.usage is not None:
        update["usage"] = combined_usage(first.answer_usage, chunk.usage)
    return chunk.model_copy(update=update)


async def open_output(
    request: ClientChannel, context: ApiContext, stream: CommandStream, params: TextGenerationParams | None = None
) -> AsyncGenerator[TokenChunk, None]:
    """`drive(...)` with its first chunk already awaited, for a streamed response: a failure
    before any output (a prompt longer than the context, a runner that refused the request,
    a lost instance) raises here as the typed error, so the route answers it with an HTTP
    error status in the caller's shape before the response starts, never a 200 followed by
    an error event. The returned iterator yields that first chunk, then the rest."""
    output = drive(request, context, stream, params)
    try:
        first: TokenChunk | None = await anext(output)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await output.aclose()
        raise

    async def replay() -> AsyncGenerator[TokenChunk, None]:
        async with aclosing(output):
            if first is None:
                return
            yield first
            async for chunk in output:
                yield chunk

    return replay()


async def open_outputs(
    request: ClientChannel, context: ApiContext, streams: list[CommandStream], params: TextGenerationParams | None = None
) -> list[AsyncGenerator[TokenChunk, None]]:
    """`open_output` for each of several choices: any failure before the first chunk of any
    of them raises here (the route answers an HTTP error before the response starts), after
    closing the outputs already opened (which cancels their commands) and the rest."""
    outputs: list[AsyncGenerator[TokenChunk, None]] = []
    try:
        for stream in streams:
            outputs.append(await open_output(request, context, stream, params))
    except BaseException:
        for output in outputs:
            await output.aclose()
        for stream in streams[len(outputs):]:
            if stream.close():
                cancel_later(context, stream.command_id)
        raise
    return outputs


async def interleaved(outputs: list[AsyncGenerator[TokenChunk, None]]) -> AsyncGenerator[tuple[int, TokenChunk | None], None]:
    """The chunks of several outputs as they arrive, each with its output's index, and
    (index, None) once that output ended. One pending read per output (bounded); leaving
    early cancels the reads and closes every output."""
    pending: dict[asyncio.Future[TokenChunk], int] = {}
    try:
        for index, output in enumerate(outputs):
            pending[asyncio.ensure_future(anext(output))] = index
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                index = pending.pop(future)
                try:
                    chunk = future.result()
                except StopAsyncIteration:
                    yield index, None
                    continue
                yield index, chunk
                pending[asyncio.ensure_future(anext(outputs[index]))] = index
    finally:
        for future in pending:
            future.cancel()
        # A read still in flight must end before its output can close (closing a running
        # async generator raises); cancelled, each output's own cleanup runs.
        await asyncio.gather(*pending, return_exceptions=True)
        for output in outputs:
            await output.aclose()


async def encoded_choice_events(
    streams: list[CommandStream],
    outputs: list[AsyncGenerator[TokenChunk, None]],
    encoders: Sequence[ChoiceEncoder],
    on_failure: Callable[[StreamFailed], Iterable[str]],
) -> AsyncGenerator[str, None]:
    """The streaming body of several choices of one request (n > 1, or several prompts):
    every choice's chunks interleaved as they come, each encoded with its own index, each
    choice finished on its own (its finish_reason), then the request closed once (summed
    usage, `[DONE]`). The first failing choice fails the whole stream (the others are
    cancelled as the outputs close)."""
    for encoder in encoders:
        for event in encoder.start():
            yield event
    try:
        async for index, chunk in interleaved(outputs):
            events = encoders[index].finish() if chunk is None else encoders[index].chunk_to_sse(chunk)
            if events:
                yield "".join(events)
    except StreamFailed as failure:
        logger.info("command %s ended: %s (%s)", streams[0].command_id, failure.error_type, failure.message)
        for event in on_failure(failure):
            yield event
        return
    for event in encoders[0].closing(encoders):
        yield event


def _find_instance(context: ApiContext, model_id: str) -> Instance | None:
    find = context.find_instance
    assert find is not None  # ApiContext.__post_init__ fills in the default lookup
    return find(model_id)


def _placed_instance(context: ApiContext, params: P, limits_error: Callable[[P], ApiError | None]) -> Instance:
    """The first checks every request passes, in order: integers fit the wire, the request
    is within its limits, and its model is placed (404 naming the fix otherwise)."""
    check_wire_ints(params)
    if (too_much := limits_error(params)) is not None:
        raise too_much
    instance = _find_instance(context, params.model_id)
    if instance is None:
        raise ModelNotFound(params.model_id)
    return instance


async def start_workload(context: ApiContext, params: OneResultParams) -> CommandStream:
    """Check the request is within its workload's limits, its model is placed (404), the
    placed engine serves the workload (400 naming both) and there is a master (503); then
    open the command's stream and submit `RunWorkload`. The caller reads its one result
    with `collect_result`. Any one-result workload (`skulk.shared.types.workloads`) takes
    this path: nothing here knows which."""
    row = workload_of(params)
    instance = _placed_instance(context, params, workload_limits_error)
    engine = backend_engine(instance.shards[0].backend)
    if not serves_workload(engine, row.kind):
        raise FeatureUnsupported(row.kind, engine, params.model_id, param="model")
    refuse_if_not_serving(context, params.model_id)
    if context.get_master()[0] is None:
        raise ClusterNotReady("The cluster has no master yet (election in progress); retry shortly.")
    command_id = CommandId(new_id())
    stream = context.streams.open(command_id, params.model_id, requested_by=current_principal().id,
                                  workload=row.kind)
    hold_input(context, stream, TaskInput(command_id=command_id, params=params))
    await submit(context, stream, RunWorkload(command_id=command_id, params=row.redact(params)))
    return stream


async def collect_result(
    request: Request, context: ApiContext, stream: CommandStream, result_type: type[R]
) -> tuple[R, Usage | None]:
    """The one result of a completed one-result stream, and its usage. No result, several,
    or one of another workload is a protocol violation (502), never an answer passed off as
    complete."""
    chunks: list[ResultChunk] = []
    async with aclosing(_follow(request, context, stream, ResultChunk)) as output:
        async for chunk in output:
            chunks.append(chunk)
    if len(chunks) != 1 or not isinstance(chunks[0].result, result_type):
        got = "no result" if not chunks else f"{len(chunks)} results" if len(chunks) > 1 else (
            f"a {chunks[0].result.workload} result")
        raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION,
                           f"The runner returned {got} for one {result_type.__name__}.", origin="api")
    return chunks[0].result, chunks[0].usage


async def follow_results(
    request: ClientChannel, context: ApiContext, stream: CommandStream, result_type: type[R]
) -> AsyncGenerator[tuple[R, Usage | None], None]:
    """The results of a workload that answers in several (`Workload.serve_stream`: a
    transcript segment by segment, speech sentence by sentence), in order, each with its
    usage so far, the last one marked `final`. The final result is handed over only once the
    runner's stream has ended, so a caller that stops reading at it never cancels a command
    that completed. A result of another workload, or a stream that ends without a final
    result, is a protocol violation (502). Callers wrap it in `contextlib.aclosing` so that
    leaving early cancels the command."""
    final: tuple[R, Usage | None] | None = None
    async with aclosing(_follow(request, context, stream, ResultChunk)) as output:
        async for chunk in output:
            result: Any = chunk.result
            if not isinstance(result, result_type) or final is not None:
                got = "a result after its final one" if final else f"a {getattr(result, 'workload', '?')} result"
                raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION,
                                   f"The runner returned {got} for {result_type.__name__}s.", origin="api")
            if getattr(result, "final", True):
                final = (result, chunk.usage)
                continue
            yield result, chunk.usage
    if final is None:
        raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION,
                           f"The runner ended its {result_type.__name__}s without a final one.", origin="api")
    yield final


async def embeddings_of(
    request: Request, context: ApiContext, params: EmbeddingParams
) -> tuple[list[list[float]], Usage | None]:
    """Run an embeddings request: one vector per input, checked (a count other than one per
    input is a protocol violation, 502, never a short answer passed off as complete)."""
    stream = await start_workload(context, params)
    result, usage = await collect_result(request, context, stream, EmbeddingResult)
    expected = len(params.embedding_inputs)
    if len(result.embeddings) != expected:
        raise StreamFailed(StreamErrorType.PROTOCOL_VIOLATION,
                           f"The runner returned {len(result.embeddings)} embeddings for {expected} inputs.",
                           origin="api")
    return result.embeddings, usage


def _call_id_factory(command_id: str) -> Callable[[int], str]:
    """Tool-call ids unique per request and stable for its calls: `call_<command>_<n>`."""
    return lambda index: f"call_{command_id}_{index}"


def hold_input(context: ApiContext, stream: CommandStream, item: TaskInput) -> None:
    """Hand the request's full params to the relay, after checking that the cluster's framing
    can carry them (it packs them when the serving node is another one) and that they are
    within the per-command transfer bound: a value it cannot carry is the caller's 400 (and
    an input too large its 413) now, not a request lost on the way."""
    try:
        pack(item)
    except OverflowError as exc:
        stream.close()
        raise InvalidRequest(f"The request holds a number too large to carry: {exc}.") from exc
    size_bytes = len(encode_input(item))
    if size_bytes > MAX_COMMAND_INPUT_BYTES:
        stream.close()
        raise PayloadTooLarge(f"The request's input is {size_bytes} bytes serialized; at most "
                              f"{MAX_COMMAND_INPUT_BYTES} travel to the serving node.", code="input_too_large")
    context.hold_input(item)


async def submit(context: ApiContext, stream: CommandStream, command: Command) -> None:
    """Submit `command`; when the master cannot be reached, free `stream` and raise 503."""
    try:
        await context.submit_command(command)
    except OverflowError as exc:
        # Framing refused a value (an integer past 64 bits deep in a tool schema, say):
        # the request's fault, not the cluster's.
        stream.close()
        context.discard_input(stream.command_id)
        raise InvalidRequest(f"The request holds a number too large to carry: {exc}.") from exc
    except Exception as exc:
        stream.close()
        context.discard_input(stream.command_id)
        raise ClusterNotReady(f"The command could not reach the master: {exc}") from exc


WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1
"""The integers msgpack (the cluster's framing) can carry. JSON has no bound, so a request
with `seed: 1e30` written out as an integer would otherwise fail only when the command is
framed, reading as an unreachable master (503) instead of the caller's mistake."""

_BOUNDED_INT_FIELDS = ("seed", "top_k", "max_tokens", "top_logprobs", "dimensions")


def check_wire_ints(params: object) -> None:
    """`InvalidRequest` naming the first integer parameter the cluster cannot carry."""
    for name in _BOUNDED_INT_FIELDS:
        value = getattr(params, name, None)
        if value is not None and not (WIRE_INT_MIN <= value <= WIRE_INT_MAX):
            raise InvalidRequest(f"'{name}' is out of range: {value}.", param=name)


def refuse_if_not_serving(context: ApiContext, model_id: str) -> None:
    """`ModelNotServing` (503, now) when every placed instance of the model has a runner
    down; a model still loading is waited for (the master binds the request to it)."""
    verdict = model_serving(context.get_state(), model_id)
    if verdict.refused:
        raise ModelNotServing(model_id, verdict.refusal())


def check_features(instance: Instance, params: TextGenerationParams,
                   param_names: Mapping[str, str] | None = None, *, card: ModelCard | None = None) -> None:
    """`FeatureUnsupported` for the first feature `params` asks for that the engine serving
    `instance` does not honour (the engine traits table; with the model's `card`, on the
    engine's vision path when the card puts it there); `param_names` maps internal
    parameter names to the caller's (Ollama's `format` for `response_format`, say)."""
    engine = backend_engine(instance.shards[0].backend)
    pipelined = is_pipelined(instance.sharding, len(instance.shards))
    vision = card is not None and on_vision_path(engine, card.family, "vision" in card.capabilities)
    for feature, param in missing_features(engine, params, pipelined=pipelined, vision=vision):
        raise FeatureUnsupported(feature.value, f"{engine} (vision path)" if vision else engine
                                 if not pipelined else f"{engine} (pipeline over "
                                 f"{len(instance.shards)} nodes)", params.model_id,
                                 param=(param_names or {}).get(param, param))


def check_vision(context: ApiContext, params: TextGenerationParams,
                 param_names: Mapping[str, str] | None = None) -> None:
    """A 400 naming the model when `params` carries images and its card does not say the
    model sees (the engine's half is `check_features`, Feature.IMAGES)."""
    if not media.image_count(params.messages):
        return
    param = (param_names or {}).get("messages", "messages")
    if (refusal := media.vision_refusal(params.model_id, context.get_cards().get(params.model_id), param)) is not None:
        raise refusal


async def fetched_images(context: ApiContext, model: str, urls: Sequence[tuple[str, str]],
                         param: str = "messages") -> dict[str, bytes]:
    """The bodies of a request's image URLs (`skulk.api.image_fetch`), fetched only once the
    model (`model` as typed) is known to accept images: a blind model's request is refused
    (400 naming it) without any fetch."""
    if not urls:
        return {}
    model_id = placed_model(context, model)
    if (refusal := media.vision_refusal(model_id, context.get_cards().get(ModelId(model_id)), param)) is not None:
        raise refusal
    return await fetch_request_images(urls)


def check_reasoning_switch(context: ApiContext, params: TextGenerationParams,
                           param_names: Mapping[str, str] | None = None) -> None:
    """A 400 naming the caller's parameter when the model cannot turn its reasoning on, off
    or to the level asked (`skulk.shared.reasoning_switches`)."""
    if params.thinking is None and params.reasoning_effort is None:
        return
    card = context.get_cards().get(params.model_id)
    reasoning = card.reasoning if card is not None else None
    why = reasoning_refusal(reasoning is not None and reasoning.format != "none",
                            reasoning.switches if reasoning is not None else (),
                            params.thinking, params.reasoning_effort)
    if why is not None:
        internal = "reasoning_effort" if params.reasoning_effort is not None and "level" in why else "thinking"
        param = (param_names or {}).get(internal, internal)
        raise InvalidRequest(f"{params.model_id} {why}; leave '{param}' unset for this model.", param=param,
                             code="reasoning_switch_unsupported")


def check_speculative(context: ApiContext, params: TextGenerationParams,
                      param_names: Mapping[str, str] | None = None) -> None:
    """A 400 naming the caller's parameter when the request's `speculative` is not how the
    model is served (`skulk.shared.types.speculative.request_refusal`)."""
    if params.speculative is None:
        return
    card = context.get_cards().get(params.model_id)
    why = speculative_request_refusal(card.runtime.speculative if card is not None else None, params.speculative)
    if why is not None:
        param = (param_names or {}).get("speculative", "speculative")
        raise InvalidRequest(f"{params.model_id} {why}; leave '{param}' unset for this model.", param=param,
                             code="speculative_unsupported")


def placed_model(context: ApiContext, typed: str) -> str:
    """The placed model a request's `model` means: itself, or the repo an Ollama library
    name (`llama3.2:1b`) or `repo:QUANT` resolves to once that repo is placed
    (`skulk.models.model_names.placed_model_id`). Responses still echo what was typed."""
    placed = {instance.model_id for instance in context.list_instances()}
    return placed_model_id(typed, placed, context.get_cards(), load_library())


def for_placed_model(context: ApiContext, params: P) -> P:
    """`params` naming the placed model its `model_id` means (`placed_model`)."""
    model_id = placed_model(context, params.model_id)
    return params if model_id == params.model_id else params.model_copy(update={"model_id": ModelId(model_id)})


def bind_instance(context: ApiContext, params: TextGenerationParams, *, max_tokens_param: str = "max_tokens",
                  param_names: Mapping[str, str] | None = None) -> Instance:
    """The placed instance `params` will run on, after the checks every wire format shares:
    the model is placed (404 naming the fix otherwise), its engine honours every feature
    asked for (400 naming feature and engine), `max_tokens` fits its context (400
    naming `max_tokens_param`, the caller's name for it), the request is within
    `skulk.api.limits` (messages, text, a lower bound of its prompt against the context: 400
    before any runner queues it), some instance of it serves or is loading (503 naming the
    down runners otherwise), and there is a master (503)."""
    instance = _placed_instance(context, params, generation_limits_error)
    engine = backend_engine(instance.shards[0].backend)
    if not serves_workload(engine, "text"):
        # A speech model (or an embedding-only engine) answers its own routes, not chat.
        raise FeatureUnsupported("text generation", engine, params.model_id, param="model")
    check_vision(context, params, param_names)
    check_features(instance, params, param_names, card=context.get_cards().get(params.model_id))
    check_reasoning_switch(context, params, param_names)
    check_speculative(context, params, param_names)
    if (too_long := context_error(params, instance.context_token_limit)) is not None:
        raise too_long
    if params.max_tokens is not None and params.max_tokens > instance.context_token_limit:
        raise InvalidRequest(
            f"'{max_tokens_param}' is {params.max_tokens}, but {params.model_id} is placed with a context of "
            f"{instance.context_token_limit} tokens.",
            param=max_tokens_param,
        )
    refuse_if_not_serving(context, params.model_id)
    if context.get_master()[0] is None:
        raise ClusterNotReady("The cluster has no master yet (election in progress); retry shortly.")
    return instance


async def start_generation(
    context: ApiContext, params: TextGenerationParams, *, max_tokens_param: str = "max_tokens",
    param_names: Mapping[str, str] | None = None,
) -> CommandStream:
    """Bind `params` (see `bind_instance`), open its stream and submit `GenerateText`. The
    caller must then consume the stream through `drive` (or close it)."""
    command_id = CommandId(new_id())
    trace = begin_trace(context, command_id, params.model_id)
    bind_request_ids(commandId=command_id, traceId=command_id if trace is not None else None)
    bind_instance(context, params, max_tokens_param=max_tokens_param, param_names=param_names)
    return await _submit_generation(context, params, command_id, trace)


async def _submit_generation(context: ApiContext, params: TextGenerationParams, command_id: CommandId,
                             trace: RequestTrace | None) -> CommandStream:
    """Open a stream for a bound request and submit its `GenerateText`."""
    stream = context.streams.open(command_id, params.model_id, requested_by=current_principal().id)
    if trace is not None:
        trace.mark("api.submit")
        stream.trace = trace
    # The text travels to the serving node over the data plane; the master (and so the event
    # log and /state) sees only the redacted request (`skulk.shared.types.task_inputs`).
    hold_input(context, stream, TaskInput(command_id=command_id, params=params))
    await submit(context, stream, GenerateText(command_id=command_id, params=params.redacted(),
                                              traced=trace is not None))
    if trace is not None:
        trace.mark("api.wait_runner")
    return stream


def begin_trace(context: ApiContext, command_id: str, model_id: str) -> RequestTrace | None:
    """A trace for this request when tracing is on cluster-wide (the replicated flag), else
    None: the whole cost of tracing when it is off is this check."""
    store = getattr(context, "traces", None)
    if store is None or not context.get_state().tracing_enabled:
        return None
    return RequestTrace(store, command_id, model_id)


def choice_params(params: TextGenerationParams, n: int) -> list[TextGenerationParams]:
    """The params of each of `n` choices: the same request, and with a seed, consecutive
    seeds (the same seed would draw the same text n times; OpenAI's choices differ)."""
    if n == 1 or params.seed is None:
        return [params] * n
    return [params.model_copy(update={"seed": (params.seed + i) % (WIRE_INT_MAX + 1)}) for i in range(n)]


async def start_choices(
    context: ApiContext, params: TextGenerationParams, n: int, *, max_tokens_param: str = "max_tokens",
    param_names: Mapping[str, str] | None = None,
) -> list[CommandStream]:
    """`start_generation` for each of `n` choices (see `choice_params`), bound once. When a
    later submit fails, the streams already open are closed and their commands cancelled."""
    bind_instance(context, params, max_tokens_param=max_tokens_param, param_names=param_names)
    streams: list[CommandStream] = []
    try:
        for choice in choice_params(params, n):
            command_id = CommandId(new_id())
            streams.append(await _submit_generation(context, choice, command_id,
                                                    begin_trace(context, command_id, params.model_id)))
    except BaseException:
        for stream in streams:
            if stream.close():
                cancel_later(context, stream.command_id)
        raise
    return streams


async def collect_choices(
    request: ClientChannel, context: ApiContext, streams: list[CommandStream], params: TextGenerationParams
) -> list[list[TokenChunk]]:
    """The shaped chunks of every choice, driven side by side; the first failure fails the
    request (and leaving cancels the other choices, through `drive`)."""

    async def collect(stream: CommandStream) -> list[TokenChunk]:
        async with aclosing(drive(request, context, stream, params)) as output:
            return [chunk async for chunk in output]

    tasks = [asyncio.ensure_future(collect(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


__all__ = [
    "SSE_HEADERS",
    "ChoiceEncoder",
    "ClientChannel",
    "StreamEncoder",
    "api_context",
    "bind_instance",
    "cancel_later",
    "check_features",
    "check_vision",
    "check_wire_ints",
    "choice_params",
    "collect_choices",
    "collect_result",
    "drive",
    "embeddings_of",
    "encoded_choice_events",
    "encoded_events",
    "fetched_images",
    "finished_later",
    "for_placed_model",
    "interleaved",
    "open_output",
    "open_outputs",
    "placed_model",
    "refuse_if_not_serving",
    "send_later",
    "start_choices",
    "start_generation",
    "start_workload",
    "submit",
]


class StreamEncoder(Protocol):
    """A wire format's streaming serialiser: events before, per chunk, and after the output."""

    def start(self) -> Iterable[str]: ...
    def chunk_to_sse(self, chunk: TokenChunk) -> Iterable[str]: ...
    def finish(self) -> Iterable[str]: ...


class ChoiceEncoder(StreamEncoder, Protocol):
    """A `StreamEncoder` for one of several choices, which can also close the whole stream."""

    def closing(self, encoders: Any) -> Iterable[str]: ...


async def encoded_events(
    request: ClientChannel,
    context: ApiContext,
    stream: CommandStream,
    encoder: StreamEncoder,
    on_failure: Callable[[StreamFailed], Iterable[str]],
    params: TextGenerationParams | None = None,
    output: AsyncGenerator[TokenChunk, None] | None = None,
) -> AsyncGenerator[str, None]:
    """The streaming body of one request in its caller's wire format: the encoder's events
    around the output, or the format's error events when the stream fails. `output` is the
    stream's chunks when the route already opened them (`open_output`)."""
    for event in encoder.start():
        yield event
    pending: list[str] = []
    try:
        async with aclosing(output if output is not None else drive(request, context, stream, params)) as chunks:
            async for chunk in chunks:
                pending.extend(encoder.chunk_to_sse(chunk))
                if stream.queued == 0 and pending:
                    # Tokens that arrived together leave in one write: one send through the
                    # ASGI stack per batch, not per token, when the client side falls behind.
                    yield "".join(pending)
                    pending.clear()
    except StreamFailed as failure:
        if pending:
            yield "".join(pending)
        logger.info("command %s ended: %s (%s)", stream.command_id, failure.error_type, failure.message)
        for event in on_failure(failure):
            yield event
        return
    if pending:
        yield "".join(pending)
    for event in encoder.finish():
        yield event
