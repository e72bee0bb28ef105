"""The caller side of capability calls: `describe` a node, `call_capability` on it.

A call is node-addressed and direct: `OpenCall` goes to the provider's node, which admits it
and answers `started` (or a refusal) on `provider_data`; output chunks come back in order to
this node, and each call keeps them in its own bounded queue, so a slow reader fills only its
own (and ends only its own call `overloaded`). Every wait has a deadline: the provider's
first answer within `OPEN_TIMEOUT_S` (else `node_unreachable`), the terminal within the
call's deadline plus `DEADLINE_GRACE_S` (else `deadline_exceeded`). A reader that leaves
early, or a deadline that passes, cancels the call at the provider.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from skulk.extensions.providers.bounds import (
    CALL_QUEUE_FRAMES,
    DEADLINE_GRACE_S,
    DEFAULT_CALL_TIMEOUT_S,
    DESCRIBE_TIMEOUT_S,
    MAX_CALL_TIMEOUT_S,
    MAX_CHUNK_BYTES,
    MAX_INPUT_BYTES,
    MAX_PENDING_OPENS,
    OPEN_TIMEOUT_S,
    SHUTDOWN_WAIT_S,
)
from skulk.extensions.providers.errors import CapabilityError, error_kind_from_wire
from skulk.extensions.providers.lifecycle import Inbound, Outbound, emit, expired, json_size, receive
from skulk.shared.types.providers import (
    IO_MODES,
    STREAMING_INPUT_MODES,
    CancelCall,
    CapabilitiesDescribed,
    CapabilityDescriptor,
    DescribeCapabilities,
    IoMode,
    OpenCall,
    ProviderFrame,
)

log = logging.getLogger(__name__)

Send = Callable[[str, BaseModel], Awaitable[None]]


class CapabilityCall:
    """One open call: iterate it for the output chunks (`result()` for a unary call);
    `send()` and `complete()` (input half-close) feed a client- or bidirectional stream."""

    def __init__(self, client: CapabilityClient, node: str, call_id: str, timeout_s: float) -> None:
        self._client = client
        self.node = node
        self.call_id = call_id
        self.timeout_s = timeout_s
        opened_at = client.clock()
        self._open_deadline = opened_at + min(OPEN_TIMEOUT_S, timeout_s + DEADLINE_GRACE_S)
        self._deadline = opened_at + timeout_s + DEADLINE_GRACE_S
        self.io_mode: IoMode | None = None
        self.view = Inbound()
        self.frames: deque[ProviderFrame] = deque()
        self.wake = asyncio.Event()
        self.started = asyncio.Event()
        self.error: CapabilityError | None = None
        self.done = False
        self._input = Outbound(call_id, "input")

    # -- what the client's receive loop calls -----------------------------------------

    def take(self, frame: ProviderFrame, now: float) -> None:
        if self.done:
            return
        step = receive(self.view, frame, now)
        self.view = step.view
        for item in step.deliver:
            if item.kind == "started":
                mode = item.payload.get("ioMode") if isinstance(item.payload, dict) else None
                self.io_mode = mode if mode in IO_MODES else None  # type: ignore[assignment]
                self.started.set()
                continue
            if item.kind == "chunk" and len(self.frames) >= CALL_QUEUE_FRAMES:
                self._client.counts["overflows"] += 1
                self.fail(
                    CapabilityError(
                        "overloaded", f"the reader did not keep up: {CALL_QUEUE_FRAMES} chunks wait", node=self.node
                    ),
                    cancel=True,
                )
                return
            self.frames.append(item)
            if item.terminal:
                self.done = True
                self.started.set()
                self._client.forget(self)  # ended: what is left is read from this call's own queue
        if step.violation is not None:
            self.fail(CapabilityError("protocol_violation", step.violation, node=self.node), cancel=True)
        self.wake.set()

    def fail(self, error: CapabilityError, *, cancel: bool) -> None:
        """End the call here with `error` (and tell the provider when it may still run)."""
        if self.done:
            return
        self.done = True
        self.error = error
        self.started.set()
        self.wake.set()
        self._client.forget(self)
        if cancel:
            self._client.send_cancel(self, error.message)

    # -- the caller's side --------------------------------------------------------------

    async def wait_started(self) -> IoMode | None:
        """Wait for the provider to admit the call; raises the refusal or `node_unreachable`."""
        while not self.started.is_set():
            remaining = self._open_deadline - self._client.clock()
            if remaining <= 0:
                self.fail(
                    CapabilityError(
                        "node_unreachable",
                        f"node {self.node} did not answer the open within {OPEN_TIMEOUT_S:g} s",
                        node=self.node,
                    ),
                    cancel=True,
                )
                break
            try:
                async with asyncio.timeout(remaining):
                    await self.started.wait()
            except TimeoutError:
                continue
        if self.io_mode is None:
            await self._raise_terminal()
        return self.io_mode

    async def _raise_terminal(self) -> None:
        """The call ended before it started: raise why (the same error every time)."""
        if self.error is None:
            terminal = next((frame for frame in self.frames if frame.terminal), None)
            self.error = (
                _terminal_error(terminal, self.node)
                if terminal is not None
                else CapabilityError("protocol_violation", "the call ended without a terminal", node=self.node)
            )
        raise self.error

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.outputs()

    async def outputs(self) -> AsyncIterator[Any]:
        """The output chunks in order; ends at `completed`, raises CapabilityError otherwise.
        Leaving early cancels the call at the provider."""
        try:
            await self.wait_started()
            while True:
                if self.frames:
                    frame = self.frames.popleft()
                    if frame.kind == "chunk":
                        yield frame.payload
                        continue
                    if frame.kind == "completed":
                        return
                    raise _terminal_error(frame, self.node)
                if self.error is not None:
                    raise self.error
                self.wake.clear()
                remaining = self._deadline - self._client.clock()
                if remaining <= 0:
                    self.fail(
                        CapabilityError(
                            "deadline_exceeded",
                            f"no end within the call's {self.timeout_s:g} s deadline",
                            node=self.node,
                        ),
                        cancel=True,
                    )
                    continue
                try:
                    async with asyncio.timeout(remaining):
                        await self.wake.wait()
                except TimeoutError:
                    continue
        finally:
            if not self.done:
                self.fail(CapabilityError("cancelled", "the caller left the call", node=self.node), cancel=True)
            self._client.forget(self)

    async def result(self) -> Any:
        """A unary call's result."""
        results = [chunk async for chunk in self.outputs()]
        if len(results) != 1:
            raise CapabilityError("protocol_violation", f"a unary call answered {len(results)} results", node=self.node)
        return results[0]

    async def send(self, value: Any) -> None:
        """One input chunk (client- and bidirectional streaming)."""
        await self._send_input("chunk", value)

    async def complete(self) -> None:
        """Half-close: no more input. The provider's output goes on until it finishes."""
        await self._send_input("completed")

    async def cancel(self, reason: str = "the caller cancelled the call") -> None:
        self.fail(CapabilityError("cancelled", reason, node=self.node), cancel=True)
        self._client.forget(self)

    async def _send_input(self, kind: str, value: Any = None) -> None:
        mode = await self.wait_started()
        if mode not in STREAMING_INPUT_MODES:
            raise CapabilityError("mode_unsupported", f"a {mode} call takes no input stream", node=self.node)
        if self.done:  # its output stream tells why; input has nowhere to go
            raise CapabilityError("input_invalid", "the call has ended: no more input", node=self.node)
        if kind == "chunk":
            size = json_size(value)
            if size > MAX_CHUNK_BYTES:
                raise CapabilityError(
                    "payload_too_large", f"an input chunk is {size} bytes, over the cap of {MAX_CHUNK_BYTES}"
                )
        frames = []
        if self._input.next_seq == 0:
            self._input, started = emit(self._input, "started")
            frames.append(started)
        self._input, frame = emit(self._input, kind, value)  # type: ignore[arg-type]
        frames.append(frame)
        for item in frames:
            await self._client.send_or_unreachable(self.node, item)


def _terminal_error(frame: ProviderFrame, node: str) -> CapabilityError:
    kind = "cancelled" if frame.kind == "cancelled" else error_kind_from_wire(frame.error_kind)
    return CapabilityError(kind, frame.message or kind, node=node)


class CapabilityClient:
    def __init__(self, node_id: str, send: Send, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self._send = send
        self.clock = clock
        self._calls: dict[str, CapabilityCall] = {}
        self._describes: dict[str, tuple[str, asyncio.Future[tuple[CapabilityDescriptor, ...]]]] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        self.counts: dict[str, int] = {"opened": 0, "cancelsSent": 0, "strayFrames": 0, "overflows": 0}
        """`overflows`: calls ended because their reader did not keep up (their queue's drops)."""

    async def describe(self, node: str, timeout_s: float = DESCRIBE_TIMEOUT_S) -> tuple[CapabilityDescriptor, ...]:
        """The descriptors `node` serves; `node_unreachable` when it does not answer in time."""
        request_id = uuid.uuid4().hex
        future: asyncio.Future[tuple[CapabilityDescriptor, ...]] = asyncio.get_running_loop().create_future()
        self._describes[request_id] = (node, future)
        try:
            await self.send_or_unreachable(node, DescribeCapabilities(request_id=request_id))
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise CapabilityError(
                "node_unreachable", f"node {node} did not describe its capabilities within {timeout_s:g} s", node=node
            ) from None
        finally:
            self._describes.pop(request_id, None)

    async def call_capability(
        self,
        node: str,
        capability_id: str,
        version: str,
        revision: str,
        payload: Any = None,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        io_modes: tuple[IoMode, ...] = IO_MODES,
    ) -> CapabilityCall:
        """Open a call pinned to `revision`. Iterate the result for output chunks (or await
        `result()` for a unary call); streaming-input calls take `send()` and `complete()`."""
        if not 0 < timeout_s <= MAX_CALL_TIMEOUT_S:
            raise CapabilityError("input_invalid", f"timeout must be in (0, {MAX_CALL_TIMEOUT_S:g}] s")
        size = json_size(payload)
        if size > MAX_INPUT_BYTES:
            raise CapabilityError("payload_too_large", f"the input is {size} bytes, over the cap of {MAX_INPUT_BYTES}")
        waiting = sum(1 for c in self._calls.values() if not c.started.is_set())
        if waiting >= MAX_PENDING_OPENS:
            raise CapabilityError("overloaded", f"{MAX_PENDING_OPENS} calls from this node wait to be admitted")
        call = CapabilityCall(self, node, uuid.uuid4().hex, timeout_s)
        self._calls[call.call_id] = call
        self.counts["opened"] += 1
        try:
            await self.send_or_unreachable(
                node,
                OpenCall(
                    call_id=call.call_id,
                    capability_id=capability_id,
                    version=version,
                    revision=revision,
                    io_modes=io_modes,
                    input=payload,
                    timeout_s=timeout_s,
                ),
            )
        except CapabilityError:
            self.forget(call)
            raise
        return call

    async def call(
        self,
        node: str,
        capability_id: str,
        version: str,
        revision: str,
        payload: Any = None,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> Any:
        """A unary call's result."""
        opened = await self.call_capability(
            node, capability_id, version, revision, payload, timeout_s=timeout_s, io_modes=("unary",)
        )
        return await opened.result()

    # -- receive ------------------------------------------------------------------------

    def on_described(self, sender: str, answer: CapabilitiesDescribed) -> None:
        waiting = self._describes.get(answer.request_id)
        if waiting is not None and waiting[0] == sender and not waiting[1].done():
            waiting[1].set_result(answer.descriptors)

    def on_output(self, sender: str, frame: ProviderFrame) -> None:
        call = self._calls.get(frame.call_id)
        if call is None or call.node != sender:
            self.counts["strayFrames"] += 1
            return
        call.take(frame, self.clock())

    def tick(self) -> None:
        now = self.clock()
        for call in list(self._calls.values()):
            problem = expired(call.view, now)
            if problem is not None:
                call.fail(CapabilityError("protocol_violation", problem, node=call.node), cancel=True)

    # -- plumbing -----------------------------------------------------------------------

    def forget(self, call: CapabilityCall) -> None:
        self._calls.pop(call.call_id, None)

    async def send_or_unreachable(self, node: str, message: BaseModel) -> None:
        try:
            await self._send(node, message)
        except Exception as exc:
            raise CapabilityError("node_unreachable", f"cannot reach node {node}: {exc}", node=node) from exc

    def send_cancel(self, call: CapabilityCall, reason: str) -> None:
        self.counts["cancelsSent"] += 1

        async def cancel() -> None:
            try:
                await self._send(call.node, CancelCall(call_id=call.call_id, reason=reason[:512]))
            except Exception as exc:
                log.info("cancel of capability call %s could not reach node %s: %s", call.call_id, call.node, exc)

        task = asyncio.ensure_future(cancel())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def close(self) -> None:
        for call in list(self._calls.values()):
            call.fail(CapabilityError("cancelled", "the node is stopping", node=call.node), cancel=True)
        if self._side_tasks:
            await asyncio.wait(list(self._side_tasks), timeout=SHUTDOWN_WAIT_S)

    def stats(self) -> dict[str, Any]:
        return {
            "open": len(self._calls),
            **self.counts,
            "queues": [
                {"callId": c.call_id, "node": c.node, "depth": len(c.frames), "capacity": CALL_QUEUE_FRAMES}
                for c in self._calls.values()
            ],
        }


__all__ = ["CapabilityCall", "CapabilityClient"]
