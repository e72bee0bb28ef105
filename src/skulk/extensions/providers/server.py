"""The provider side of capability calls: admission, running handlers, and their frames.

`open_refusal` is the pure admission decision (capability, revision, mode, deadline,
payload cap, input schema, the node's concurrency bound), taken before any provider code
runs. `ProviderServer` is the shell: one owned task per admitted call, which emits
`started`, runs the handler under the call's deadline, checks every chunk, and sends the
terminal only after the handler's iterator returned and its `finally` ran. Provider code is
always guarded: what it raises ends its own call `provider_failed`, never the node.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from skulk.extensions.providers.bounds import (
    CALL_QUEUE_FRAMES,
    MAX_CALL_TIMEOUT_S,
    MAX_CHUNK_BYTES,
    MAX_CONCURRENT_CALLS,
    MAX_INPUT_BYTES,
    MAX_OUTPUT_BYTES,
    SHUTDOWN_WAIT_S,
)
from skulk.extensions.providers.contract import CallContext
from skulk.extensions.providers.errors import CapabilityError
from skulk.extensions.providers.lifecycle import (
    Inbound,
    Outbound,
    as_json,
    check_chunk,
    emit,
    expired,
    json_size,
    receive,
)
from skulk.extensions.providers.registry import ProviderRegistry, Registered
from skulk.shared.types.providers import (
    STREAMING_INPUT_MODES,
    CancelCall,
    CapabilitiesDescribed,
    DescribeCapabilities,
    FrameKind,
    OpenCall,
    ProviderFrame,
)

log = logging.getLogger(__name__)

Send = Callable[[str, BaseModel], Awaitable[None]]

HANDLER_CLOSE_TIMEOUT_S = 5.0
"""How long a handler's iterator may take to close (its `finally`) before the call ends
anyway; the terminal is withheld until then."""


def _stale_revision(entry: Registered, call: OpenCall) -> CapabilityError | None:
    descriptor = entry.descriptor
    if call.revision == descriptor.revision:
        return None
    return CapabilityError(
        "revision_mismatch",
        f"{descriptor.tag} is at revision {descriptor.revision}, "
        f"the call pinned {call.revision or '(none)'}: read the descriptor again",
    )


def _mode_not_driven(entry: Registered, call: OpenCall) -> CapabilityError | None:
    mode = entry.descriptor.io_mode
    if mode in call.io_modes:
        return None
    return CapabilityError(
        "mode_unsupported", f"{entry.descriptor.tag} is {mode}; this caller drives only {', '.join(call.io_modes)}"
    )


def _deadline_too_long(call: OpenCall) -> CapabilityError | None:
    if call.timeout_s <= MAX_CALL_TIMEOUT_S:
        return None
    return CapabilityError(
        "input_invalid", f"timeout {call.timeout_s:g} s is over the maximum of {MAX_CALL_TIMEOUT_S:g} s"
    )


def _value_for_a_stream(entry: Registered, call: OpenCall) -> CapabilityError | None:
    if entry.descriptor.io_mode not in STREAMING_INPUT_MODES or call.input is None:
        return None
    return CapabilityError(
        "input_invalid", f"{entry.descriptor.tag} takes its input as a stream of chunks, not an input value"
    )


def _input_too_large(entry: Registered, call: OpenCall) -> CapabilityError | None:
    if entry.descriptor.io_mode in STREAMING_INPUT_MODES:
        return None
    size = json_size(call.input)
    if size <= MAX_INPUT_BYTES:
        return None
    return CapabilityError("payload_too_large", f"the input is {size} bytes, over the cap of {MAX_INPUT_BYTES}")


def _input_breaks_schema(entry: Registered, call: OpenCall) -> CapabilityError | None:
    if entry.descriptor.io_mode in STREAMING_INPUT_MODES:
        return None  # each input chunk is checked as it arrives
    problem = entry.input_problem(call.input)
    if problem is None:
        return None
    return CapabilityError("input_invalid", f"the input breaks {entry.descriptor.tag}'s input schema: {problem}")


def _at_capacity(active_calls: int, max_calls: int) -> CapabilityError | None:
    if active_calls < max_calls:
        return None
    return CapabilityError("overloaded", f"this node already serves {max_calls} calls")


def open_refusal(
    entry: Registered | None, call: OpenCall, active_calls: int, max_calls: int = MAX_CONCURRENT_CALLS
) -> CapabilityError | None:
    """Why the call may not start here, or None. Ordered: what the caller can fix first,
    then this node's load (a retry helps only then)."""
    if entry is None:
        return CapabilityError("capability_not_found", f"{call.capability_id}@{call.version} is not served here")
    return (
        _stale_revision(entry, call)
        or _mode_not_driven(entry, call)
        or _deadline_too_long(call)
        or _value_for_a_stream(entry, call)
        or _input_too_large(entry, call)
        or _input_breaks_schema(entry, call)
        or _at_capacity(active_calls, max_calls)
    )


class _Inputs:
    """The caller's input chunks of one call, in order, bounded; the handler's `inputs`."""

    def __init__(self, served: _Served) -> None:
        self._served = served
        self.view = Inbound()
        self.items: deque[ProviderFrame] = deque()
        self.wake = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        while True:
            if self.items:
                frame = self.items.popleft()
                if frame.kind == "chunk":
                    return frame.payload
                raise StopAsyncIteration  # the caller's half-close
            self.wake.clear()
            await self.wake.wait()


@dataclass
class _Served:
    caller: str
    call: OpenCall
    entry: Registered
    task: asyncio.Task[None] | None = None
    inputs: _Inputs | None = None
    ended_by: CapabilityError | None = None
    """Set when something outside the handler ends the call (the caller's cancel, its input)."""
    out: Outbound | None = None
    """The output direction's sender (its next seq survives a handler that raises)."""

    def emit(self, kind: FrameKind, payload: Any = None, *, error: CapabilityError | None = None) -> ProviderFrame:
        assert self.out is not None
        self.out, frame = emit(
            self.out, kind, payload, error_kind=error.kind if error else None, message=error.message if error else None
        )
        return frame


class ProviderServer:
    def __init__(
        self, registry: ProviderRegistry, node_id: str, send: Send, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry = registry
        self.node_id = node_id
        self._send = send
        self._clock = clock
        self._calls: dict[tuple[str, str], _Served] = {}
        self.max_calls = MAX_CONCURRENT_CALLS
        self._side_tasks: set[asyncio.Task[None]] = set()
        self.counts: dict[str, int] = {
            "opened": 0,
            "refused": 0,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
            "iteratorsClosed": 0,
            "describes": 0,
            "strayFrames": 0,
            "inputOverflows": 0,  # calls ended because their provider did not take the input
        }

    # -- control ------------------------------------------------------------------------

    def on_describe(self, sender: str, request: DescribeCapabilities) -> None:
        self.counts["describes"] += 1
        answer = CapabilitiesDescribed(request_id=request.request_id, descriptors=self.registry.descriptors())
        self._spawn(self._send_quietly(sender, answer), f"describe-{request.request_id}")

    def on_open(self, sender: str, call: OpenCall) -> None:
        key = (sender, call.call_id)
        if key in self._calls:
            return  # a duplicate open: the call already runs
        entry = self.registry.get(call.capability_id, call.version)
        refusal = open_refusal(entry, call, len(self._calls), self.max_calls)
        if refusal is not None or entry is None:
            self.counts["refused"] += 1
            error = refusal or CapabilityError("capability_not_found", call.capability_id)
            log.info("capability call %s from %s refused: %s", call.call_id, sender, error)
            _, frame = emit(Outbound(call.call_id, "output"), "failed", error_kind=error.kind, message=error.message)
            self._spawn(self._send_quietly(sender, frame), f"refuse-{call.call_id}")
            return
        served = _Served(caller=sender, call=call, entry=entry, out=Outbound(call.call_id, "output"))
        if entry.descriptor.io_mode in STREAMING_INPUT_MODES:
            served.inputs = _Inputs(served)
        self._calls[key] = served
        self.counts["opened"] += 1
        served.task = asyncio.create_task(self._run(key, served), name=f"capability-call-{call.call_id}")

    def on_cancel(self, sender: str, cancel: CancelCall) -> None:
        served = self._calls.get((sender, cancel.call_id))
        if served is not None:
            self._end(served, CapabilityError("cancelled", cancel.reason or "the caller cancelled the call"))

    # -- data ---------------------------------------------------------------------------

    def on_input(self, sender: str, frame: ProviderFrame) -> None:
        served = self._calls.get((sender, frame.call_id))
        if served is None or served.inputs is None:
            self.counts["strayFrames"] += 1
            return
        inputs = served.inputs
        step = receive(inputs.view, frame, self._clock())
        inputs.view = step.view
        for item in step.deliver:
            if item.kind == "started":
                continue
            if item.kind in ("failed", "cancelled"):
                self._end(served, CapabilityError("cancelled", item.message or "the caller ended its input"))
                return
            if item.kind == "chunk":
                error = _input_chunk_error(served.entry, item.payload)
                if error is not None:
                    self._end(served, error)
                    return
                if len(inputs.items) >= CALL_QUEUE_FRAMES:
                    self.counts["inputOverflows"] += 1
                    self._end(
                        served,
                        CapabilityError(
                            "overloaded",
                            f"the provider did not take the caller's input: {CALL_QUEUE_FRAMES} chunks wait",
                        ),
                    )
                    return
            inputs.items.append(item)
            inputs.wake.set()
        if step.violation is not None:
            self._end(served, CapabilityError("protocol_violation", f"input: {step.violation}"))

    def tick(self) -> None:
        """Expire input gaps (the node's housekeeping calls this about once a second)."""
        now = self._clock()
        for served in list(self._calls.values()):
            if served.inputs is not None:
                problem = expired(served.inputs.view, now)
                if problem is not None:
                    self._end(served, CapabilityError("protocol_violation", f"input: {problem}"))

    # -- one call -----------------------------------------------------------------------

    def _end(self, served: _Served, error: CapabilityError) -> None:
        if served.ended_by is None and served.task is not None and not served.task.done():
            served.ended_by = error
            served.task.cancel()

    async def _run(self, key: tuple[str, str], served: _Served) -> None:
        call, entry = served.call, served.entry
        descriptor = entry.descriptor
        ctx = CallContext(
            call_id=call.call_id,
            capability_id=descriptor.id,
            version=descriptor.version,
            caller_node=served.caller,
            provider_node=self.node_id,
            timeout_s=call.timeout_s,
        )
        error: CapabilityError | None = None
        try:
            try:
                reason = await _maybe_await(getattr(entry.provider, "admit", lambda *_: None)(descriptor.id, ctx))
                if reason is not None:
                    raise CapabilityError("admission_refused", str(reason))
                await self._send(served.caller, served.emit("started", {"ioMode": descriptor.io_mode}))
                async with asyncio.timeout(call.timeout_s):
                    if descriptor.io_mode == "unary":
                        await self._unary(served, ctx)
                    else:
                        await self._stream(served, ctx)
            except TimeoutError:
                error = CapabilityError("deadline_exceeded", f"the call passed its {call.timeout_s:g} s deadline")
            except asyncio.CancelledError:
                if served.ended_by is None:
                    raise  # the node is stopping
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                error = served.ended_by
            except CapabilityError as exc:
                error = exc
            except Exception as exc:  # provider code must never break the node
                log.warning(
                    "capability %s call %s: the provider raised %s: %s",
                    descriptor.tag,
                    call.call_id,
                    type(exc).__name__,
                    exc,
                )
                error = CapabilityError("provider_failed", f"{type(exc).__name__}: {exc}")
            if error is None:
                frame = served.emit("completed")
                self.counts["completed"] += 1
            else:
                kind = "cancelled" if error.kind == "cancelled" else "failed"
                self.counts[kind] += 1
                frame = served.emit(kind, error=error)
            await self._send_quietly(served.caller, frame)
        finally:
            self._calls.pop(key, None)

    async def _unary(self, served: _Served, ctx: CallContext) -> None:
        entry = served.entry
        result = await _maybe_await(entry.provider.handle_call(entry.descriptor.id, served.call.input, ctx))
        error = check_chunk(result, MAX_OUTPUT_BYTES, entry.output_problem, what="result")
        if error is not None:
            raise error
        await self._send(served.caller, served.emit("chunk", as_json(result)))

    async def _stream(self, served: _Served, ctx: CallContext) -> None:
        entry = served.entry
        payload = None if served.inputs is not None else served.call.input
        produced = entry.provider.handle_stream(entry.descriptor.id, payload, served.inputs, ctx)
        if not hasattr(produced, "__anext__"):
            raise CapabilityError("provider_failed", "handle_stream must return an async iterator")
        iterator: AsyncIterator[Any] = produced
        try:
            while True:
                try:
                    item = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                error = check_chunk(item, MAX_CHUNK_BYTES, entry.output_problem)
                if error is not None:
                    raise error  # the iterator is closed below before the failure goes out
                await self._send(served.caller, served.emit("chunk", as_json(item)))
        finally:
            await self._close(iterator, served)

    async def _close(self, iterator: AsyncIterator[Any], served: _Served) -> None:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            try:
                async with asyncio.timeout(HANDLER_CLOSE_TIMEOUT_S):
                    await aclose()
            except Exception as exc:
                log.warning(
                    "capability call %s: closing the handler raised %s: %s",
                    served.call.call_id,
                    type(exc).__name__,
                    exc,
                )
        self.counts["iteratorsClosed"] += 1

    # -- plumbing -----------------------------------------------------------------------

    async def _send_quietly(self, node: str, message: BaseModel) -> None:
        try:
            await self._send(node, message)
        except Exception as exc:
            log.warning("capability answer to %s lost: %s", node, exc)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def close(self) -> None:
        tasks = [s.task for s in self._calls.values() if s.task is not None] + list(self._side_tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT_S)

    def stats(self) -> dict[str, Any]:
        return {
            "active": len(self._calls),
            "capacity": self.max_calls,
            **self.counts,
            "inputQueues": [
                {"callId": s.call.call_id, "depth": len(s.inputs.items), "capacity": CALL_QUEUE_FRAMES}
                for s in self._calls.values()
                if s.inputs is not None
            ],
        }


def _input_chunk_error(entry: Registered, value: Any) -> CapabilityError | None:
    size = json_size(value)
    if size > MAX_CHUNK_BYTES:
        return CapabilityError(
            "payload_too_large", f"an input chunk is {size} bytes, over the cap of {MAX_CHUNK_BYTES}"
        )
    problem = entry.input_problem(value)
    if problem is not None:
        return CapabilityError(
            "input_invalid", f"an input chunk breaks {entry.descriptor.tag}'s input schema: {problem}"
        )
    return None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


__all__ = ["HANDLER_CLOSE_TIMEOUT_S", "ProviderServer", "Send", "open_refusal"]
