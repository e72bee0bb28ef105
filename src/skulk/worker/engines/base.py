"""The engine protocol, the data an engine produces, and the dispatch loop in front of it.

An engine owns one loaded model inside a runner process and turns one request into a stream
of `GeneratedToken`s. Every engine sits behind the same `Dispatcher`, which admits requests
FIFO at the engine's width (1 for in-process llama.cpp), runs them on its own threads,
cancels them race-safely and reports the true in-flight count. Engine-agnostic text handling
(UTF-8 reassembly, stop strings) lives here too, so every engine streams the same way.

This module never imports an engine library, never touches IPC queues and never decides
placement; engines never manage threads or queues of their own requests.
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import ChatMessage, FinishReason, Usage
from skulk.shared.types.engines import missing_features
from skulk.shared.types.ids import RunnerId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import OneResultParams, WorkloadResult
from skulk.shared.types.workloads import workload_of

log = logging.getLogger(__name__)

DISPATCH_QUEUE_CAPACITY = 64
"""Requests admitted but not yet started, per dispatcher. Beyond it `submit` refuses with
`DispatchRejected`: a runner never queues invisibly without bound."""

WORKER_CALL_TIMEOUT_S = 900.0
"""Deadline for `Dispatcher.run_on_worker` (an engine's warm-up): one forward pass of the
largest model a node would hold, with a wide margin. A warm-up past it fails the runner."""

DISPATCH_CLOSE_TIMEOUT_S = 10.0
"""How long `Dispatcher.close` waits for running generations to notice their abort (they
check every token, so this bounds one token's compute plus one prompt evaluation)."""

# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardSpec:
    """What an engine loads: one rank of one instance, from a local artifact."""

    instance: Instance
    runner_id: RunnerId
    card: ModelCard
    model_path: str
    n_threads: int | None = None
    pool_key: bytes | None = None
    """The cluster's pool channel secret (`skulk.pool.layout.derive_pool_key`); only a
    pooled llama.cpp instance uses it."""
    draft_model_path: str | None = None
    """The draft for a card with `runtime.speculative = "draft"`: a GGUF file (llama-server)
    or an mlx-lm model directory (MLX)."""
    projector_path: str | None = None
    """The multimodal projector (mmproj GGUF) for a card that sees images (llama-server)."""

    @property
    def shard(self) -> ShardAssignment:
        shard = self.instance.shard_for_runner(self.runner_id)
        if shard is None:
            raise ValueError(f"runner {self.runner_id} has no shard in instance {self.instance.instance_id}")
        return shard


@dataclass(frozen=True, slots=True)
class GeneratedToken:
    """One sampled token as the client sees it. `text` is the newly releasable text, which
    may be empty (bytes of an unfinished UTF-8 sequence, or text that might start a stop
    string, are held back). The last token of a finished generation carries `finish_reason`
    and `usage`."""

    text: str
    token_id: int | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None
    """On the last token: the request's stop string that ended the generation (dropped
    from the text), so the API can say which one (Anthropic's `stop_sequence`)."""
    prompt_tokens: int | None = None
    """On the first token: the prompt's length in tokens, known before the first token, so
    a stream can report it at its start (Anthropic's `message_start`)."""


@dataclass(frozen=True, slots=True)
class GeneratedResult:
    """The whole answer to a one-result workload (embeddings, echo): its result model
    (`skulk.shared.types.workload_io.WorkloadResult`) and the tokens it read."""

    result: WorkloadResult
    usage: Usage


GenerationOutcome = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """How one dispatched request ended."""

    outcome: GenerationOutcome
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error_type: str | None = None
    error_message: str | None = None
    fatal: bool = False
    """The engine can never serve again (`EngineBroken`): the runner reports this request,
    then itself Failed with the message, and exits."""


def chat_message_dict(message: ChatMessage) -> dict[str, Any]:
    """A ChatMessage in the shape Hugging Face chat templates expect."""
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content:
        # Qwen 3 and DeepSeek templates read `reasoning_content`, gpt-oss's `thinking`.
        out["reasoning_content"] = out["thinking"] = message.reasoning_content
    return out


def usage_of(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        cached_tokens=cached_tokens,
    )


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


class EngineError(Exception):
    """A failure an engine can explain; `error_type` is what the client's stream carries."""

    error_type: ClassVar[str] = StreamErrorType.ENGINE_ERROR


class EngineBroken(EngineError):
    """The engine can never serve again, typically a distributed group that lost a rank
    mid-request (its ranks are out of step). The request fails with this message, so the
    client learns what broke; then the runner exits, so the worker sees a dead runner rather
    than a live one that fails every later request."""

    error_type = StreamErrorType.ENGINE_BROKEN


class EngineNotLoaded(EngineError):
    error_type = StreamErrorType.ENGINE_NOT_LOADED


class EngineBusy(EngineError):
    """More concurrent generations than the engine's width (a dispatcher bug if seen)."""

    error_type = StreamErrorType.ENGINE_BUSY


class ModelLoadFailed(EngineError):
    error_type = StreamErrorType.MODEL_LOAD_FAILED


class ChatTemplateMissing(EngineError):
    error_type = StreamErrorType.CHAT_TEMPLATE_MISSING


class WorkloadUnsupported(EngineError):
    error_type = StreamErrorType.WORKLOAD_UNSUPPORTED


class PromptTooLong(EngineError):
    error_type = StreamErrorType.CONTEXT_LENGTH_EXCEEDED

    def __init__(self, prompt_tokens: int, context_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens
        super().__init__(
            # OpenAI's wording: clients (LiteLLM) recognise a context overflow by it.
            f"This model's maximum context length is {context_tokens} tokens, but the prompt is "
            f"{prompt_tokens} tokens and must leave room for at least one generated token."
        )

    def __reduce__(self):  # pickling rebuilds from the fields, not from the message
        return (PromptTooLong, (self.prompt_tokens, self.context_tokens))


class DispatchRejected(Exception):
    """The dispatcher refused a request; `error_type` says why in the client's stream."""

    def __init__(self, error_type: str, message: str) -> None:
        self.error_type = error_type
        self.message = message
        super().__init__(error_type, message)

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------------------------------
# The engine protocol
# ---------------------------------------------------------------------------------------


@runtime_checkable
class Engine(Protocol):
    """One loaded model. `load` and `warm_up` run once, on the runner's main thread;
    `generate` runs on dispatcher threads, at most `concurrency` at a time."""

    @property
    def concurrency(self) -> int:
        """How many generations the engine runs at once: the dispatcher's width."""
        ...

    @property
    def in_flight(self) -> int:
        """Generations inside `generate` right now (the engine's own view)."""
        ...

    def load(self, spec: ShardSpec) -> None: ...

    def warm_up(self) -> None: ...

    def generate(self, request: TextGenerationParams, cancelled: threading.Event) -> Iterator[GeneratedToken]:
        """Stream tokens. Checks `cancelled` at every token and returns early (without a
        finish_reason) when it is set. Raises `EngineError` for explainable failures."""
        ...

    def close(self) -> None: ...


ApiRequest = TextGenerationParams | OneResultParams


# ---------------------------------------------------------------------------------------
# Streaming text helpers shared by every engine
# ---------------------------------------------------------------------------------------


class Utf8StreamDecoder:
    """Bytes of consecutive tokens in, text out, never splitting a UTF-8 sequence: bytes of
    an unfinished character are held until the token that completes it. Invalid bytes become
    U+FFFD; an unfinished sequence left at the end is dropped (it can never become text)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, piece: bytes) -> str:
        return self._decoder.decode(piece, final=False)

    @property
    def pending_bytes(self) -> int:
        return len(self._decoder.getstate()[0])


class StopStringFilter:
    """Holds back text that might be the start of a stop string; reports the first match.

    `push(text)` returns (releasable_text, matched). On a match the releasable text is
    everything before the stop string and the stop string itself (and what follows) is
    dropped. Text is held only while it could still complete a stop string, so a match can
    never begin inside text already released."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if self.matched is not None:
            return "", True
        if not self._stops:
            return text, False
        buffer = self._held + text
        first: tuple[int, str] | None = None
        for stop in self._stops:
            at = buffer.find(stop)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.matched = first[1]
            self._held = ""
            return buffer[: first[0]], True
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Release held text at the end of a generation (no stop string completed)."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        best = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best


# ---------------------------------------------------------------------------------------
# Dispatcher
# ---------------------------------------------------------------------------------------


class DispatchSink(Protocol):
    """Where a dispatcher reports. Called from dispatcher threads (on_start, on_token,
    on_finish) or from the caller of `cancel`/`close` (on_finish of a request that never
    started). For one request the calls are ordered: on_start?, on_token*, on_finish, and
    on_finish happens exactly once, after the request no longer counts as in flight."""

    def on_start(self, request_id: str) -> None: ...

    def on_token(self, request_id: str, token: GeneratedToken | GeneratedResult) -> None: ...

    def on_finish(self, request_id: str, result: GenerationResult) -> None: ...


@dataclass
class _Job:
    request_id: str
    request: ApiRequest
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    abort: GenerationResult | None = None
    """Set when the dispatcher (not the client) ends the job, e.g. on close."""


@dataclass
class _Call:
    """A function to run on a worker thread (see `Dispatcher.run_on_worker`), not a request."""

    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(frozen=True)
class DispatchStats:
    width: int
    queued: int
    running: int
    queue_capacity: int
    admitted_total: int
    rejected_total: int
    completed_total: int
    failed_total: int
    cancelled_total: int


def _image_digest_error(request: TextGenerationParams) -> str | None:
    """The first image of the request whose bytes are not what the API node checked."""
    for message in request.messages:
        for image in message.images:
            if (error := image.digest_error()) is not None:
                return error
    return None


class Dispatcher:
    """FIFO admission at a fixed width in front of one engine.

    `submit` admits (or refuses with `DispatchRejected`); `width` worker threads take jobs in
    admission order and stream them through the sink. `cancel` is idempotent and race-safe:
    a queued job is removed and finished as cancelled at once, a running one is signalled
    and stops at its next token, a finished or unknown one is left alone. `in_flight` counts
    admitted jobs whose `on_finish` has not been issued (queued plus running)."""

    def __init__(
        self,
        engine: Engine,
        sink: DispatchSink,
        *,
        width: int = 1,
        queue_capacity: int = DISPATCH_QUEUE_CAPACITY,
        name: str = "dispatch",
        engine_name: str | None = None,
        pipelined: bool = False,
        vision: bool = False,
    ) -> None:
        if width < 1:
            raise ValueError(f"dispatcher width must be >= 1, got {width}")
        self._engine = engine
        self._engine_name = engine_name
        """The engine's name in the traits table; with it, a request for a feature the
        engine lacks is refused at admission (the API refuses it first; this is the guard)."""
        self._pipelined = pipelined
        """Whether the engine runs a pipeline over several ranks (fewer features, see the table)."""
        self._vision = vision
        """Whether the model runs on the engine's vision path (its features apply)."""
        self._sink = sink
        self._width = width
        self._capacity = queue_capacity
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queue: deque[_Job | _Call] = deque()
        self._jobs: dict[str, _Job] = {}
        self._closed = False
        self._counts = {"admitted": 0, "rejected": 0, "completed": 0, "failed": 0, "cancelled": 0}
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(width)
        ]
        for thread in self._threads:
            thread.start()

    # -- public -----------------------------------------------------------------------

    @property
    def width(self) -> int:
        return self._width

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    @property
    def running(self) -> int:
        with self._lock:
            return sum(1 for job in self._jobs.values() if job.started)

    @property
    def queued(self) -> int:
        """Requests admitted and not started (calls from `run_on_worker` are not requests)."""
        with self._lock:
            return sum(1 for job in self._queue if isinstance(job, _Job))

    def submit(self, request_id: str, request: ApiRequest) -> None:
        with self._lock:
            refusal = self._refusal(request_id) or self._unsupported(request)
            if refusal is not None:
                self._counts["rejected"] += 1
                raise refusal
            job = _Job(request_id, request)
            self._jobs[request_id] = job
            self._queue.append(job)
            self._counts["admitted"] += 1
            self._wakeup.notify()

    def run_on_worker(self, fn: Callable[[], object], timeout_s: float = WORKER_CALL_TIMEOUT_S) -> None:
        """Run `fn` on a dispatcher thread ahead of every request queued after it; re-raise
        what it raises. For an engine's warm-up: a CPU engine whose thread pools belong to
        the calling thread (llama.cpp's OpenMP teams) must warm up on the thread that will
        decode, or it keeps two pools of waiting threads."""
        call = _Call(fn)
        with self._lock:
            if self._closed:
                raise DispatchRejected("RunnerShutdown", "the runner is shutting down")
            self._queue.append(call)
            self._wakeup.notify()
        if not call.done.wait(timeout_s):
            raise TimeoutError(f"{getattr(fn, '__qualname__', fn)} did not finish within {timeout_s:g}s")
        if call.error is not None:
            raise call.error

    def cancel(self, request_id: str) -> bool:
        """True when the request was in flight (and is now ending as cancelled)."""
        with self._lock:
            job = self._jobs.get(request_id)
            if job is None:
                return False
            job.cancelled.set()
            if job.started:
                return True
            self._queue.remove(job)
            del self._jobs[request_id]
            self._counts["cancelled"] += 1
        self._finish_unstarted(job, GenerationResult(outcome="cancelled", finish_reason="cancelled"))
        return True

    def close(self, timeout_s: float = DISPATCH_CLOSE_TIMEOUT_S, *, error_type: str = StreamErrorType.RUNNER_SHUTDOWN,
              message: str = "the runner is shutting down") -> bool:
        """Refuse new work; end every job in flight as failed with `error_type`. Returns
        True when every worker thread exited within `timeout_s`."""
        abort = GenerationResult(outcome="failed", finish_reason="error", error_type=error_type, error_message=message)
        with self._lock:
            self._closed = True
            unstarted = [job for job in self._queue if isinstance(job, _Job)]
            for call in self._queue:
                if isinstance(call, _Call):
                    call.error = DispatchRejected(error_type, message)
                    call.done.set()
            self._queue.clear()
            for job in unstarted:
                del self._jobs[job.request_id]
                self._counts["failed"] += 1
            for job in self._jobs.values():
                job.abort = abort
                job.cancelled.set()
            self._wakeup.notify_all()
        for job in unstarted:
            self._finish_unstarted(job, abort)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def stats(self) -> DispatchStats:
        with self._lock:
            running = sum(1 for job in self._jobs.values() if job.started)
            return DispatchStats(
                width=self._width,
                queued=sum(1 for job in self._queue if isinstance(job, _Job)),
                running=running,
                queue_capacity=self._capacity,
                admitted_total=self._counts["admitted"],
                rejected_total=self._counts["rejected"],
                completed_total=self._counts["completed"],
                failed_total=self._counts["failed"],
                cancelled_total=self._counts["cancelled"],
            )

    # -- internals ----------------------------------------------------------------------

    def _refusal(self, request_id: str) -> DispatchRejected | None:
        if self._closed:
            return DispatchRejected("RunnerShutdown", "the runner is shutting down")
        if request_id in self._jobs:
            return DispatchRejected("DuplicateTask", f"request {request_id} is already in flight")
        if len(self._queue) >= self._capacity:
            return DispatchRejected(
                "RunnerBusy", f"{len(self._queue)} requests already queued (capacity {self._capacity})"
            )
        return None

    def _unsupported(self, request: ApiRequest) -> DispatchRejected | None:
        if self._engine_name is None or not isinstance(request, TextGenerationParams):
            return None
        for feature, param in missing_features(self._engine_name, request, pipelined=self._pipelined,
                                                  vision=self._vision):
            return DispatchRejected(
                "FeatureUnsupported", f"the {self._engine_name} engine does not support {feature.value} ({param!r})")
        return None

    def _finish_unstarted(self, job: _Job, result: GenerationResult) -> None:
        try:
            self._sink.on_finish(job.request_id, result)
        except Exception:
            log.exception("dispatch sink failed finishing request %s", job.request_id)

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if not self._queue:
                    return  # closed and drained
                job = self._queue.popleft()
                if isinstance(job, _Job):
                    job.started = True
            if isinstance(job, _Call):
                self._call(job)
                continue
            result = self._run(job)
            with self._lock:
                self._jobs.pop(job.request_id, None)
                self._counts[result.outcome] += 1
            try:
                self._sink.on_finish(job.request_id, result)
            except Exception:
                log.exception("dispatch sink failed finishing request %s", job.request_id)

    @staticmethod
    def _call(call: _Call) -> None:
        try:
            call.fn()
        except BaseException as exc:  # handed to the caller, who decides what it means
            call.error = exc
        finally:
            call.done.set()

    def _run(self, job: _Job) -> GenerationResult:
        if not isinstance(job.request, TextGenerationParams):
            return self._one_result(job, job.request)
        if (corrupt := _image_digest_error(job.request)) is not None:
            return GenerationResult(outcome="failed", finish_reason="error",
                                    error_type=StreamErrorType.PROTOCOL_VIOLATION, error_message=corrupt)
        if job.request.count_only:
            return self._count(job, job.request)
        last: GeneratedToken | None = None
        try:
            self._sink.on_start(job.request_id)
            if not job.cancelled.is_set():
                tokens = self._engine.generate(job.request, job.cancelled)
                try:
                    for token in tokens:
                        self._sink.on_token(job.request_id, token)
                        last = token
                        if token.finish_reason is not None or job.cancelled.is_set():
                            break
                finally:
                    close = getattr(tokens, "close", None)
                    if close is not None:
                        close()  # release the engine now, not when the generator is collected
        except EngineError as exc:
            return GenerationResult(
                outcome="failed", finish_reason="error", error_type=exc.error_type, error_message=str(exc),
                fatal=isinstance(exc, EngineBroken),
            )
        except Exception as exc:  # an engine bug must end this request, not the runner
            log.exception("generation %s failed", job.request_id)
            return GenerationResult(
                outcome="failed",
                finish_reason="error",
                error_type=type(exc).__name__,
                error_message=str(exc) or repr(exc),
            )
        if last is not None and last.finish_reason is not None:
            # Finished before any cancel took effect: a late cancel changes nothing.
            return GenerationResult(outcome="completed", finish_reason=last.finish_reason, usage=last.usage)
        if job.abort is not None:
            return job.abort
        if job.cancelled.is_set():
            return GenerationResult(outcome="cancelled", finish_reason="cancelled")
        return GenerationResult(
            outcome="failed", finish_reason="error", error_type=StreamErrorType.ENGINE_ERROR,
            error_message="the engine ended the stream without a finish reason",
        )


    def _count(self, job: _Job, request: TextGenerationParams) -> GenerationResult:
        """A count-only request: the prompt's tokens as the engine would feed them, as one
        empty token carrying the usage; nothing is generated (Anthropic's count_tokens)."""
        counter = getattr(self._engine, "prompt_tokens", None)
        # An engine whose prompt holds more than its text's tokens (a served one's images)
        # counts them itself.
        count = getattr(self._engine, "prompt_token_count", None)
        try:
            self._sink.on_start(job.request_id)
            if count is not None:
                usage = usage_of(count(request), 0)
            elif counter is not None:
                usage = usage_of(len(counter(request)), 0)
            else:
                raise EngineError(f"the {type(self._engine).__name__} engine cannot count prompt tokens")
            self._sink.on_token(job.request_id, GeneratedToken("", None, "stop", usage))
        except EngineError as exc:
            return GenerationResult(outcome="failed", finish_reason="error", error_type=exc.error_type,
                                    error_message=str(exc))
        except Exception as exc:  # an engine bug must end this request, not the runner
            log.exception("count %s failed", job.request_id)
            return GenerationResult(outcome="failed", finish_reason="error", error_type=type(exc).__name__,
                                    error_message=str(exc) or repr(exc))
        return GenerationResult(outcome="completed", finish_reason="stop", usage=usage)

    def _one_result(self, job: _Job, request: OneResultParams) -> GenerationResult:
        """A one-result workload runs as one step through the engine method its row names
        (`skulk.shared.types.workloads`): it is not interruptible, so a cancel that arrives
        meanwhile only decides that its result is dropped. An engine without the method
        refuses it, typed."""
        row = workload_of(request)
        try:
            self._sink.on_start(job.request_id)
            method = getattr(self._engine, row.engine_method, None)
            if method is None or (row.serve is None and row.serve_stream is None):
                raise WorkloadUnsupported(
                    f"the {type(self._engine).__name__} engine does not serve {row.kind} ({row.meaning})")
            if row.serve_stream is not None:
                return self._result_stream(job, row.serve_stream(method, request))
            if not job.cancelled.is_set() and row.serve is not None:
                result, prompt_tokens = row.serve(method, request)
                if not job.cancelled.is_set():
                    self._sink.on_token(job.request_id, GeneratedResult(result, usage_of(prompt_tokens, 0)))
                    return GenerationResult(outcome="completed", finish_reason="stop", usage=usage_of(prompt_tokens, 0))
        except EngineError as exc:
            return GenerationResult(
                outcome="failed", finish_reason="error", error_type=exc.error_type, error_message=str(exc)
            )
        except Exception as exc:  # an engine bug must end this request, not the runner
            log.exception("%s %s failed", row.kind, job.request_id)
            return GenerationResult(
                outcome="failed", finish_reason="error", error_type=type(exc).__name__, error_message=str(exc) or repr(exc)
            )
        return job.abort or GenerationResult(outcome="cancelled", finish_reason="cancelled")

    def _result_stream(self, job: _Job, results: Iterator[tuple[WorkloadResult, int]]) -> GenerationResult:
        """Each result the engine yields, in order, until its final one or a cancel (checked
        between results; the iterator is closed then, so the engine stops its work). The
        caller turns an engine's raise into the request's failure."""
        usage = usage_of(0, 0)
        try:
            for result, prompt_tokens in results:
                if job.cancelled.is_set():
                    break
                usage = usage_of(prompt_tokens, 0)
                self._sink.on_token(job.request_id, GeneratedResult(result, usage))
                if getattr(result, "final", True):
                    return GenerationResult(outcome="completed", finish_reason="stop", usage=usage)
                if job.cancelled.is_set():
                    break  # before asking for the next result, so the engine does no more work
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()
        if job.cancelled.is_set():
            return job.abort or GenerationResult(outcome="cancelled", finish_reason="cancelled")
        raise EngineError("the engine ended its results without a final one")


__all__ = [
    "DISPATCH_CLOSE_TIMEOUT_S",
    "DISPATCH_QUEUE_CAPACITY",
    "WORKER_CALL_TIMEOUT_S",
    "ApiRequest",
    "ChatTemplateMissing",
    "DispatchRejected",
    "DispatchSink",
    "DispatchStats",
    "Dispatcher",
    "Engine",
    "EngineBroken",
    "EngineBusy",
    "EngineError",
    "EngineNotLoaded",
    "GeneratedResult",
    "GeneratedToken",
    "GenerationOutcome",
    "GenerationResult",
    "ModelLoadFailed",
    "PromptTooLong",
    "ShardSpec",
    "StopStringFilter",
    "Utf8StreamDecoder",
    "WorkloadUnsupported",
    "chat_message_dict",
    "usage_of",
]
