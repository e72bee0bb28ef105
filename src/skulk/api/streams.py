"""The owning API's per-command output streams.

A request that becomes a command (`GenerateText`, `RunWorkload`) opens one `CommandStream` here
before the command is submitted; the runner's data-plane frames for that command, addressed
to this node, come back through `CommandStreams.deliver`. This module validates each
stream's lifecycle (StreamStarted seq 0, StreamPayload seq 1, 2, ..., one StreamTerminal at
the next seq) before anything reaches the request, and guarantees that every stream ends:
with the runner's terminal, or with a typed `StreamFailed` when the runner breaks protocol,
falls silent (idle lease), never starts (first-frame deadline), loses its terminal frame on
the way (the terminal grace after State shows the task Complete), the client reads too slowly,
the master fails over, or the cluster reports the task failed.

Everything here runs on the API's event loop: `deliver` and the other mutators are plain
synchronous calls that never block (a node receiving frames on another thread must hand
them over with `loop.call_soon_threadsafe`). This module must never send commands or talk
to the network: deciding to cancel or finish a task belongs to the route that owns the
request (see `StreamFailed.origin`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from skulk.api.errors import Overloaded, StreamFailed
from skulk.observe.field_telemetry import StreamEnded
from skulk.shared.types.chunks import (
    Chunk,
    DataFrame,
    ErrorChunk,
    StreamPayload,
    StreamStarted,
    StreamTerminal,
    TokenChunk,
)
from skulk.shared.types.stream_errors import StreamErrorType

logger = logging.getLogger(__name__)

MAX_OPEN_STREAMS = 256
"""Concurrent open command streams per API node; the next request gets a typed 503
(`Overloaded`). Each open stream may buffer MAX_QUEUED_FRAMES chunks, so this also bounds
the memory the API can hold for output at 256 x 1024 chunks."""

MAX_QUEUED_FRAMES = 1024
"""Chunks one stream may hold that its client has not read yet. A client this far behind
(about a minute of output at typical decode speeds) is failed with `client_too_slow` rather
than letting one slow reader hold unbounded memory."""

IDLE_LEASE_S = 30 * 60.0
"""A stream that receives no frame for this long ends in `idle_timeout` and frees its slot:
an omitted terminal must not hold admission forever. Renewed by every frame (the seed's
30-minute lease)."""

FIRST_FRAME_DEADLINE_S = 120.0
"""A stream whose StreamStarted has not arrived this long after opening ends in
`first_frame_timeout`: the command was lost, or no runner took it."""

TERMINAL_GRACE_S = 10.0
"""How long a stream may wait for its terminal frame once State shows its task Complete (the
runner finished and its worker said so through the master). Frames and events travel on
different planes, so the terminal usually comes first and may come a little later; one that
has not arrived by then was dropped on the way (a full send queue, a lost publish), and the
stream ends in `terminal_lost` instead of holding its client for the 30-minute idle lease."""

RECENTLY_ENDED_MEMORY = 1024
"""How many ended command ids are remembered, so that frames still in flight after a stream
ended (a cancel race, a late terminal) are counted as late rather than unknown."""


class StreamObserver(Protocol):
    """Told about every stream's output and end (the node's metrics). Called on the event
    loop, in the frame's path: it must be cheap and must never raise."""

    def on_chunk(self, model_id: str, since_previous_s: float, first: bool, is_token: bool) -> None: ...
    def on_end(self, model_id: str, outcome: str, prompt_tokens: int, cached_tokens: int = 0,
               drafted_tokens: int = 0, accepted_draft_tokens: int = 0) -> None: ...


class StreamTrace(Protocol):
    """A traced request's API-side spans (`skulk.observe.traces.RequestTrace`)."""

    def mark(self, next_phase: str) -> None: ...
    def chunk(self) -> None: ...
    def end(self, outcome: str) -> None: ...


FrameProblem = str
"""Why a frame breaks its stream's lifecycle, in words for the log and the client."""


def check_frame(next_seq: int | None, frame: DataFrame) -> FrameProblem | None:
    """Whether `frame` may come next on a stream that expects `next_seq` (None: nothing seen
    yet, so only StreamStarted may come). None means the frame is in order."""
    if isinstance(frame, StreamStarted):
        return None if next_seq is None else "duplicate StreamStarted"
    kind = "payload" if isinstance(frame, StreamPayload) else "terminal"
    if next_seq is None:
        return f"{kind} seq {frame.seq} before StreamStarted"
    if frame.seq != next_seq:
        return f"{kind} seq {frame.seq}, expected {next_seq}"
    return None


@dataclass(frozen=True)
class _Completed:
    """The end of a stream whose runner reported success."""


_COMPLETED = _Completed()
_End = _Completed | StreamFailed


class CommandStream:
    """One command's output, as the request handler sees it: an async iterator of chunks.

    Iteration yields the payload chunks in order and stops after a completed terminal; for
    any other end it raises `StreamFailed` (after the chunks that arrived first, except when
    the client closed the stream). Waiting for the next chunk also enforces the idle lease
    and the first-frame deadline, so a waiting consumer never outlives them. One consumer
    (the request's handler) reads a stream.
    """

    def __init__(self, owner: CommandStreams, command_id: str, opened_at: float, model_id: str = "",
                 requested_by: str = "anonymous", workload: str = "text") -> None:
        self.command_id = command_id
        self.model_id = model_id
        self.workload = workload
        """'text' for a generation, else the one-result workload's kind ('embeddings', ...)."""
        self.requested_by = requested_by
        """The principal that made the request (`skulk.api.access.Principal.id`): only it (or an
        operator) may cancel it."""
        self.last_chunk_at: float | None = None
        self.first_chunk_at: float | None = None
        self.token_chunks = 0
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.drafted_tokens = 0
        self.accepted_draft_tokens = 0
        self.trace: StreamTrace | None = None
        """Set when the request is traced: told when the runner starts, of each chunk, of the end."""
        self._owner = owner
        self._chunks: deque[Chunk] = deque()
        self._end: _End | None = None
        self._waiter: asyncio.Future[None] | None = None  # the consumer waiting for a chunk or the end
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_passed = False
        self.opened_at = opened_at
        self.last_frame_at = opened_at
        self.next_seq: int | None = None
        self.runner_id: str | None = None
        self.terminal_due_at: float | None = None
        """Set once State shows the task Complete: the terminal frame must arrive by then."""
        self.error_chunk: ErrorChunk | None = None

    # -- consumer side --

    @property
    def ended(self) -> bool:
        """The stream has its end (chunks may still be waiting to be read)."""
        return self._end is not None

    @property
    def queued(self) -> int:
        return len(self._chunks)

    def close(self) -> bool:
        """The client went away: drop what is queued and free the slot. True when the stream
        was still open, so the caller should cancel the command in the cluster."""
        self._chunks.clear()
        return self._owner._end(
            self, StreamFailed(StreamErrorType.CLIENT_CLOSED, "the client closed the request", outcome="cancelled", origin="client")
        )

    def __aiter__(self) -> CommandStream:
        return self

    async def __anext__(self) -> Chunk:
        while True:
            if self._chunks:
                return self._chunks.popleft()
            if isinstance(self._end, StreamFailed):
                raise self._end
            if self._end is not None:
                raise StopAsyncIteration
            if self._deadline_passed:
                self._deadline_passed = False
                self._owner.expire()  # ends this stream if its deadline really passed
                continue
            loop = asyncio.get_running_loop()
            if self._deadline_timer is None:
                # One timer per deadline, not one per wait: a frame moves the idle deadline
                # later, so a timer that fires early only re-checks and is armed again.
                self._deadline_timer = loop.call_later(max(self._owner._time_left(self), 0.0), self._on_deadline)
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # -- owner side --

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        self._deadline_passed = True
        self._wake()

    def _push(self, chunk: Chunk) -> None:
        self._chunks.append(chunk)
        self._wake()

    def _rearm(self) -> None:
        """A deadline moved earlier: drop the armed timer so a waiting consumer arms a new one."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._wake()

    def _finish(self, end: _End) -> None:
        self._end = end
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._wake()


def _ended(stream: CommandStream, outcome: str, error_type: str | None) -> StreamEnded:
    """What field telemetry learns of an ended stream: timings and counts, no text."""
    first, last = stream.first_chunk_at, stream.last_chunk_at
    return StreamEnded(
        command_id=stream.command_id, model_id=stream.model_id, workload=stream.workload, outcome=outcome,
        error_type=error_type,
        first_output_s=None if first is None else first - stream.opened_at,
        decode_s=None if first is None or last is None else last - first,
        output_chunks=stream.token_chunks, prompt_tokens=stream.prompt_tokens,
        completion_tokens=stream.completion_tokens, cached_tokens=stream.cached_tokens,
    )


_OUTCOME_COUNTER = {"completed": "completed", "client_closed": "closedByClient", "cancelled": "cancelled",
                    "failed": "failed"}
"""How a stream ended (the metrics' `outcome` label) -> the diagnostics counter it bumps."""


class CommandStreams:
    """Every open command stream of this API node, with its bounds and counters."""

    def __init__(
        self,
        *,
        max_open_streams: int = MAX_OPEN_STREAMS,
        max_queued_frames: int = MAX_QUEUED_FRAMES,
        idle_lease_s: float = IDLE_LEASE_S,
        first_frame_deadline_s: float = FIRST_FRAME_DEADLINE_S,
        terminal_grace_s: float = TERMINAL_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        explain_wait: Callable[[str], str | None] = lambda _command_id: None,
    ) -> None:
        self._explain_wait = explain_wait
        """Why a command still has no first frame (its runners' states), for the timeout's message."""
        if max_open_streams < 1 or max_queued_frames < 1:
            raise ValueError("stream bounds must be at least 1")
        self.max_open_streams = max_open_streams
        self.max_queued_frames = max_queued_frames
        self.idle_lease_s = idle_lease_s
        self.first_frame_deadline_s = first_frame_deadline_s
        self.terminal_grace_s = terminal_grace_s
        self._clock = clock
        self.observer: StreamObserver | None = None
        """Told about output and ends (the node's metrics); None costs one check per chunk."""
        self.on_ended: Callable[[StreamEnded], None] | None = None
        """Told how each stream ended, with its timings and token counts (the node's opt-in
        field telemetry, `skulk.observe.field_collector`). Cheap and never raises, as the
        observer."""
        self.on_lifecycle: Callable[[str, str, str, str | None], None] | None = None
        """Called with (phase "opened"|"ended", command id, model id, outcome or None) as a
        stream opens and ends (the node's flight recorder)."""
        self._open: dict[str, CommandStream] = {}
        self._recently_ended: OrderedDict[str, None] = OrderedDict()
        self._counters: dict[str, int] = {
            "opened": 0,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
            "closedByClient": 0,
            "rejectedOverloaded": 0,
            "deliveredFrames": 0,
            "droppedLateFrames": 0,
            "droppedUnknownFrames": 0,
            "protocolViolations": 0,
            "expiredIdle": 0,
            "expiredFirstFrame": 0,
            "expiredTerminal": 0,
            "overflows": 0,
            "failedByFailover": 0,
        }

    # -- admission --

    def open(self, command_id: str, model_id: str = "", requested_by: str = "anonymous",
             workload: str = "text") -> CommandStream:
        """A new stream for `command_id`, before its command is submitted. Raises `Overloaded`
        at MAX_OPEN_STREAMS (after reclaiming any stream whose deadline has passed)."""
        if command_id in self._open or command_id in self._recently_ended:
            raise ValueError(f"command {command_id} already has a stream")
        if len(self._open) >= self.max_open_streams:
            self.expire()
        if len(self._open) >= self.max_open_streams:
            self._counters["rejectedOverloaded"] += 1
            raise Overloaded(
                f"This node is serving its maximum of {self.max_open_streams} concurrent requests; retry shortly."
            )
        stream = CommandStream(self, command_id, self._clock(), model_id, requested_by, workload)
        self._open[command_id] = stream
        self._counters["opened"] += 1
        if self.on_lifecycle is not None:
            self.on_lifecycle("opened", command_id, model_id, None)
        return stream

    def is_open(self, command_id: str) -> bool:
        return command_id in self._open

    def requested_by(self, command_id: str) -> str | None:
        """Who made the open request `command_id` (None: not open here)."""
        stream = self._open.get(command_id)
        return stream.requested_by if stream is not None else None

    # -- frames --

    def deliver(self, frame: DataFrame) -> None:
        """Route one DATA frame addressed to this node into its command's stream. Frames for
        unknown or ended commands are counted and dropped; frames out of lifecycle order end
        the stream with a `protocol_violation`."""
        stream = self._open.get(frame.command_id)
        if stream is None:
            late = frame.command_id in self._recently_ended
            self._counters["droppedLateFrames" if late else "droppedUnknownFrames"] += 1
            if not late:
                logger.debug("dropped %s for unknown command %s", frame.type, frame.command_id)
            return
        problem = check_frame(stream.next_seq, frame)
        if problem is not None:
            self._counters["protocolViolations"] += 1
            logger.warning("command %s: protocol violation from runner %s: %s", frame.command_id, stream.runner_id, problem)
            detail = ""
            if isinstance(frame, StreamTerminal) and frame.error_message:
                detail = f" (the runner said: {frame.outcome}: {frame.error_message})"
            self._end(stream, StreamFailed(
                StreamErrorType.PROTOCOL_VIOLATION, f"The runner broke the output protocol: {problem}{detail}.", origin="api"
            ))
            return
        self._counters["deliveredFrames"] += 1
        stream.last_frame_at = self._clock()
        if isinstance(frame, StreamStarted):
            stream.next_seq = 1
            stream.runner_id = frame.runner_id
            if stream.trace is not None:
                stream.trace.mark("api.wait_first_token")
        elif isinstance(frame, StreamPayload):
            stream.next_seq = frame.seq + 1
            self._accept_payload(stream, frame.chunk)
        else:
            self._end(stream, self._terminal_end(stream, frame))

    def _accept_payload(self, stream: CommandStream, chunk: Chunk) -> None:
        if isinstance(chunk, ErrorChunk):
            # The runner explains a failure ahead of its terminal; keep it for the end.
            stream.error_chunk = chunk
            return
        if stream.queued >= self.max_queued_frames:
            self._counters["overflows"] += 1
            logger.warning("command %s: client read too slowly (%d chunks queued)", stream.command_id, stream.queued)
            self._end(stream, StreamFailed(
                StreamErrorType.CLIENT_TOO_SLOW, f"The client fell {stream.queued} chunks behind the runner.", origin="api"
            ))
            return
        stream._push(chunk)
        if stream.trace is not None:
            stream.trace.chunk()
        if self.observer is not None or self.on_ended is not None:
            self._observe_chunk(stream, chunk)

    def _observe_chunk(self, stream: CommandStream, chunk: Chunk) -> None:
        now, last = stream.last_frame_at, stream.last_chunk_at
        first = last is None
        is_token = type(chunk) is TokenChunk
        if self.observer is not None:
            self.observer.on_chunk(stream.model_id, now - (stream.opened_at if last is None else last), first,
                                   is_token)
        if first:
            stream.first_chunk_at = now
        if is_token:
            stream.token_chunks += 1
        stream.last_chunk_at = now
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            stream.completion_tokens = usage.completion_tokens
            stream.prompt_tokens = usage.prompt_tokens
            stream.cached_tokens = usage.cached_tokens
            stream.drafted_tokens = usage.drafted_tokens
            stream.accepted_draft_tokens = usage.accepted_draft_tokens

    @staticmethod
    def _terminal_end(stream: CommandStream, frame: StreamTerminal) -> _End:
        error = stream.error_chunk
        if frame.outcome == "cancelled":
            return StreamFailed("cancelled", frame.error_message or "The request was cancelled.", outcome="cancelled")
        if frame.outcome == "failed":
            error_type = frame.error_type or (error.error_type if error else StreamErrorType.RUNNER_FAILED)
            message = frame.error_message or (error.message if error else f"The runner failed ({error_type}).")
            return StreamFailed(error_type, message)
        if error is not None:
            # A completed terminal after an error chunk: the error is what the client needs.
            return StreamFailed(error.error_type, error.message)
        return _COMPLETED

    # -- ends decided here --

    def fail(
        self, command_id: str, error_type: StreamErrorType | str, message: str, *, outcome: Literal["failed", "cancelled"] = "failed"
    ) -> bool:
        """End `command_id`'s stream with a typed failure decided by this node (for example
        the cluster reported its task failed). True when the stream was open."""
        stream = self._open.get(command_id)
        if stream is None:
            return False
        return self._end(stream, StreamFailed(error_type, message, outcome=outcome, origin="api"))

    def cancel(self, command_id: str, message: str = "The request was cancelled.") -> bool:
        """End the stream because a caller of this API asked to cancel it (and has told the
        cluster). Its client sees a cancellation. True when the stream was open."""
        stream = self._open.get(command_id)
        if stream is None:
            return False
        return self._end(stream, StreamFailed("cancelled", message, outcome="cancelled", origin="client"))

    def expect_terminal(self, command_id: str) -> bool:
        """State shows `command_id`'s task Complete: its terminal frame must arrive within
        `terminal_grace_s`, or the stream ends in `terminal_lost` (see TERMINAL_GRACE_S).
        The first call sets the deadline; True when the stream was open."""
        stream = self._open.get(command_id)
        if stream is None:
            return False
        if stream.terminal_due_at is None:
            stream.terminal_due_at = self._clock() + self.terminal_grace_s
            stream._rearm()
        return True

    def open_command_ids(self) -> list[str]:
        return list(self._open)

    def waiting_command_ids(self) -> list[str]:
        """Open streams with no StreamStarted yet: no runner has taken their command."""
        return [command_id for command_id, stream in self._open.items() if stream.next_seq is None]

    def fail_failover(self, error_type: StreamErrorType, messages: dict[str, str]) -> int:
        """End the streams a change of master affects (`skulk.api.failover`), each with its
        own message; the others continue. Returns how many ended."""
        ended = 0
        for command_id, message in messages.items():
            stream = self._open.get(command_id)
            if stream is not None:
                ended += self._end(stream, StreamFailed(error_type, message, origin="api"))
        self._counters["failedByFailover"] += ended
        if ended:
            logger.warning("master changed: ended %d of %d open command streams", ended, ended + len(self._open))
        return ended

    def fail_all(self, error_type: StreamErrorType, message: str) -> int:
        """End every open stream at once (a master failover: the new session cannot carry
        the old session's tasks). Returns how many ended."""
        ended = 0
        for stream in list(self._open.values()):
            ended += self._end(stream, StreamFailed(error_type, message, origin="api"))
        self._counters["failedByFailover"] += ended
        if ended:
            logger.warning("ended %d open command streams: %s", ended, message)
        return ended

    def expire(self, now: float | None = None) -> list[str]:
        """End every stream past its first-frame deadline or idle lease; returns their ids.
        Waiting consumers call this on their own timeout; `open` calls it when full."""
        now = self._clock() if now is None else now
        expired = []
        for stream in list(self._open.values()):
            if stream.next_seq is None and now - stream.opened_at >= self.first_frame_deadline_s:
                self._counters["expiredFirstFrame"] += 1
                why = self._explain_wait(stream.command_id)
                failure = StreamFailed(
                    StreamErrorType.FIRST_FRAME_TIMEOUT,
                    f"No runner started this request within {self.first_frame_deadline_s:g} s"
                    + (f": {why}." if why else "."),
                    origin="api",
                )
            elif stream.terminal_due_at is not None and now >= stream.terminal_due_at:
                self._counters["expiredTerminal"] += 1
                failure = StreamFailed(
                    StreamErrorType.TERMINAL_LOST,
                    "The task completed in the cluster, but its last output frame never reached this node "
                    f"within {self.terminal_grace_s:g} s; the reply may be incomplete. Retry the request.",
                    origin="api",
                )
            elif now - stream.last_frame_at >= self.idle_lease_s:
                self._counters["expiredIdle"] += 1
                failure = StreamFailed(
                    StreamErrorType.IDLE_TIMEOUT, f"No output from the runner for {self.idle_lease_s:g} s.", origin="api"
                )
            else:
                continue
            logger.warning("command %s: %s", stream.command_id, failure.message)
            self._end(stream, failure)
            expired.append(stream.command_id)
        return expired

    def _time_left(self, stream: CommandStream) -> float:
        """Seconds until `stream`'s nearest deadline."""
        now = self._clock()
        left = stream.last_frame_at + self.idle_lease_s - now
        if stream.next_seq is None:
            left = min(left, stream.opened_at + self.first_frame_deadline_s - now)
        if stream.terminal_due_at is not None:
            left = min(left, stream.terminal_due_at - now)
        return left

    def _end(self, stream: CommandStream, end: _End) -> bool:
        if self._open.get(stream.command_id) is not stream:
            return False
        del self._open[stream.command_id]
        self._recently_ended[stream.command_id] = None
        while len(self._recently_ended) > RECENTLY_ENDED_MEMORY:
            self._recently_ended.popitem(last=False)
        if isinstance(end, _Completed):
            outcome = "completed"
        elif end.origin == "client" and end.error_type == StreamErrorType.CLIENT_CLOSED:
            outcome = "client_closed"
        elif end.outcome == "cancelled":
            outcome = "cancelled"
        else:
            outcome = "failed"
        self._counters[_OUTCOME_COUNTER[outcome]] += 1
        if self.observer is not None:
            self.observer.on_end(stream.model_id, outcome, stream.prompt_tokens, stream.cached_tokens,
                                 stream.drafted_tokens, stream.accepted_draft_tokens)
        if self.on_ended is not None:
            self.on_ended(_ended(stream, outcome, None if isinstance(end, _Completed) else str(end.error_type)))
        if self.on_lifecycle is not None:
            self.on_lifecycle("ended", stream.command_id, stream.model_id, outcome)
        if stream.trace is not None:
            stream.trace.end(outcome)
        stream._finish(end)
        return True

    # -- diagnostics --

    def stats(self) -> dict[str, Any]:
        """Depth, capacity and counters, camelCase, for /v1/diagnostics/node."""
        return {
            "openStreams": len(self._open),
            "capacity": self.max_open_streams,
            "queuedFrames": sum(s.queued for s in self._open.values()),
            "maxQueuedFrames": self.max_queued_frames,
            "idleLeaseS": self.idle_lease_s,
            "firstFrameDeadlineS": self.first_frame_deadline_s,
            "terminalGraceS": self.terminal_grace_s,
            **self._counters,
        }


__all__ = [
    "FIRST_FRAME_DEADLINE_S",
    "IDLE_LEASE_S",
    "MAX_OPEN_STREAMS",
    "MAX_QUEUED_FRAMES",
    "RECENTLY_ENDED_MEMORY",
    "TERMINAL_GRACE_S",
    "CommandStream",
    "CommandStreams",
    "StreamObserver",
    "StreamTrace",
    "check_frame",
]
