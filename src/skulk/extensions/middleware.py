"""Runs the extensions' hooks under guard: chat middleware on the API node, the response
observer in the background, and the start hooks once the node's API is up.

Invariants (the seed's): an extension never breaks inference (every call is guarded; a
raising, overrunning or misbehaving hook is counted, logged and, by its declared
`failure_policy`, skipped or turned into a typed refusal of its own request), extensions
never own the response stream (observers get a frozen summary from a bounded queue that
drops and counts when full), and no extension installed means Skulk unchanged (every entry
point returns at once).

The decisions are pure (`verdict`, `checked_params`); `ExtensionRuntime` is the shell: it
owns time, the queue and the tasks. Sync hooks run off the event loop on a thread of their
own under the same deadline as async ones. A sync hook that overruns keeps its thread until
it returns (Python cannot stop a thread), but the request no longer waits for it. Those
threads are daemons, not the loop's default executor: `asyncio.run` joins that executor at
exit, so one hung hook would hold the node's shutdown forever. At most `HOOK_THREADS` run at
once; a call that finds them all busy (hung hooks) waits for one within its own deadline,
so hung hooks cost bounded threads and end as timeouts, never as a pile-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from skulk.extensions.context import ExtensionContext
from skulk.extensions.contract import FailurePolicy
from skulk.extensions.loader import ExtensionSet, LoadedExtension
from skulk.extensions.report import discovery_report
from skulk.extensions.summary import ChatResponseSummary
from skulk.shared.types.tasks import TextGenerationParams

log = logging.getLogger(__name__)

TRANSFORM_DEADLINE_S: Final = 2.0
"""How long one `transform_chat_request` may take. It runs inline before dispatch, so this
bounds the latency an extension can add to each request; past it the hook's policy decides."""

OBSERVE_DEADLINE_S: Final = 5.0
"""How long one `observe_chat_response` may take before the next summary is handed on."""

START_DEADLINE_S: Final = 30.0
"""How long one `on_start` may take."""

API_UP_WAIT_S: Final = 120.0
"""How long the start hooks wait for the node's API to come up before running anyway."""

OBSERVER_QUEUE_CAPACITY: Final = 256
"""Summaries waiting for the observers; past it a new summary is dropped and counted (a slow
observer must cost bounded memory and never slow a response)."""

HOOK_THREADS: Final = 16
"""Sync hook calls running at once on one node (each on its own daemon thread)."""

LOG_EVERY: Final = 100
"""A hook that keeps failing is logged on its first failure and then every this many."""

Outcome = Literal["returned", "raised", "timed_out", "invalid"]
Verdict = Literal["apply", "skip", "fail"]


def verdict(policy: FailurePolicy, outcome: Outcome) -> Verdict:
    """What a transform's outcome does to its request: a hook that returned usable params is
    applied; anything else is skipped, or under policy "fail" refuses the request."""
    if outcome == "returned":
        return "apply"
    return "fail" if policy == "fail" else "skip"


def checked_params(original: TextGenerationParams, returned: object) -> TextGenerationParams | str:
    """The params a transform returned, validated, or why they are refused. None means
    unchanged. A transform may change anything but the model: rerouting a request to another
    model would bypass the placement and feature checks the caller's model passed."""
    if returned is None:
        return original
    if not isinstance(returned, TextGenerationParams):
        return f"returned {type(returned).__name__}, not TextGenerationParams (or None)"
    if returned.model_id != original.model_id:
        return f"changed model_id from {original.model_id!r} to {returned.model_id!r}; a transform may not reroute"
    try:  # params built with model_copy(update=...) skip validation: check them here
        return TextGenerationParams.model_validate(returned.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"returned invalid params: {'.'.join(str(p) for p in first['loc']) or 'params'}: {first['msg']}"


class ExtensionRefused(Exception):
    """A "fail"-policy transform failed: the request must end with a typed error naming it."""

    def __init__(self, extension: str, reason: str) -> None:
        super().__init__(f"extension {extension!r} refused the request: {reason}")
        self.extension = extension
        self.reason = reason


@dataclass
class HookCounters:
    calls: int = 0
    failures: int = 0
    timeouts: int = 0

    def wire(self) -> dict[str, int]:
        return {"calls": self.calls, "failures": self.failures, "timeouts": self.timeouts}


async def call_hook(
    hook: Callable[..., Any], args: tuple[Any, ...], deadline_s: float, threads: asyncio.Semaphore
) -> Any:
    """`hook(*args)` within `deadline_s` (TimeoutError past it): an async hook awaited, a sync
    one on a daemon thread once one of `threads` is free (an awaitable it returns awaited
    too)."""
    async with asyncio.timeout(deadline_s):
        if inspect.iscoroutinefunction(hook):
            return await hook(*args)
        await threads.acquire()  # released by the thread when the hook returns, not before
        result = await _on_daemon_thread(hook, args, threads.release)
        if inspect.isawaitable(result):
            return await result
        return result


def _on_daemon_thread(hook: Callable[..., Any], args: tuple[Any, ...], done: Callable[[], None]) -> asyncio.Future[Any]:
    """A future for `hook(*args)` run on a new daemon thread; `done` is called on the loop
    when the hook returns, however long after the caller stopped waiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        done()
        if future.done():  # the caller's deadline passed: nobody waits for this result
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = hook(*args)
        except Exception as exc:  # handed to the caller, who guards it
            error = exc
        except BaseException as exc:  # SystemExit from a hook must not end the node's task
            error = RuntimeError(f"the hook raised {type(exc).__name__}")
        with contextlib.suppress(RuntimeError):  # the loop closed while the hook ran
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"extension-hook-{getattr(hook, '__name__', 'call')}", daemon=True).start()
    return future


class ExtensionRuntime:
    """The loaded extensions' hooks, guarded. `run()` is the node's owned task (start hooks,
    then the observer loop); cancelling it is the shutdown."""

    def __init__(
        self,
        extensions: ExtensionSet,
        context: ExtensionContext,
        *,
        transform_deadline_s: float = TRANSFORM_DEADLINE_S,
        observe_deadline_s: float = OBSERVE_DEADLINE_S,
        start_deadline_s: float = START_DEADLINE_S,
        queue_capacity: int = OBSERVER_QUEUE_CAPACITY,
        hook_threads: int = HOOK_THREADS,
    ) -> None:
        self.extensions = extensions
        self.context = context
        self._transform_deadline_s = transform_deadline_s
        self._observe_deadline_s = observe_deadline_s
        self._start_deadline_s = start_deadline_s
        self._transformers = extensions.with_hook("transform_chat_request")
        self._observers = extensions.with_hook("observe_chat_response")
        self._queue: asyncio.Queue[ChatResponseSummary] = asyncio.Queue(queue_capacity)
        self._capacity = queue_capacity
        self._counters: dict[tuple[str, str], HookCounters] = {}
        self._threads = asyncio.Semaphore(hook_threads)
        self.observer_dropped = 0
        self.started = False

    @property
    def transforms(self) -> bool:
        return bool(self._transformers)

    @property
    def observes(self) -> bool:
        return bool(self._observers)

    def _count(self, ext: LoadedExtension, hook: str) -> HookCounters:
        return self._counters.setdefault((ext.shape.name, hook), HookCounters())

    def _failed(self, ext: LoadedExtension, hook: str, outcome: Outcome, detail: str) -> None:
        counters = self._count(ext, hook)
        if outcome == "timed_out":
            counters.timeouts += 1
        else:
            counters.failures += 1
        total = counters.failures + counters.timeouts
        if total == 1 or total % LOG_EVERY == 0:
            log.warning(
                "extension %s: %s %s (%d so far): %s", ext.shape.name, hook, outcome.replace("_", " "), total, detail
            )

    async def _guarded(
        self, ext: LoadedExtension, hook: str, args: tuple[Any, ...], deadline_s: float
    ) -> tuple[Outcome, Any, str]:
        self._count(ext, hook).calls += 1
        try:
            return "returned", await call_hook(getattr(ext.obj, hook), args, deadline_s, self._threads), ""
        except TimeoutError:
            return "timed_out", None, f"did not return within {deadline_s:g} s"
        except Exception as exc:  # an extension's failure must never escape into Skulk
            return "raised", None, f"{type(exc).__name__}: {exc}"

    async def transform_chat_request(self, params: TextGenerationParams) -> TextGenerationParams:
        """`params` through every transform in load order (each sees the previous one's
        output). ExtensionRefused when a "fail"-policy transform fails."""
        if not params.messages:  # a raw completion prompt is no chat request
            return params
        for ext in self._transformers:
            outcome, returned, detail = await self._guarded(
                ext, "transform_chat_request", (params, self.context), self._transform_deadline_s
            )
            if outcome == "returned":
                checked = checked_params(params, returned)
                if isinstance(checked, str):
                    outcome, detail = "invalid", checked
                else:
                    params = checked
                    continue
            self._failed(ext, "transform_chat_request", outcome, detail)
            if verdict(ext.shape.failure_policy, outcome) == "fail":
                raise ExtensionRefused(ext.shape.name, detail)
        return params

    def observe_chat_response(self, summary: ChatResponseSummary) -> None:
        """Hand `summary` to the observers (never waits; dropped and counted when full)."""
        if not self._observers:
            return
        try:
            self._queue.put_nowait(summary)
        except asyncio.QueueFull:
            self.observer_dropped += 1
            if self.observer_dropped == 1 or self.observer_dropped % LOG_EVERY == 0:
                log.warning(
                    "extension observers are behind: %d summaries dropped (queue of %d full)",
                    self.observer_dropped,
                    self._capacity,
                )

    async def run(self, api_up: Callable[[], bool], poll_s: float = 0.1) -> None:
        """Run the start hooks once the API is up (`api_up`, polled up to API_UP_WAIT_S),
        then hand summaries to the observers until cancelled. Never raises otherwise."""
        starters = self.extensions.with_hook("on_start")
        if starters:
            await _wait_until(api_up, API_UP_WAIT_S, poll_s)
            for ext in starters:
                outcome, _, detail = await self._guarded(ext, "on_start", (self.context,), self._start_deadline_s)
                if outcome != "returned":
                    self._failed(ext, "on_start", outcome, detail)
        self.started = True
        while True:
            summary = await self._queue.get()
            for ext in self._observers:
                outcome, _, detail = await self._guarded(
                    ext, "observe_chat_response", (summary, self.context), self._observe_deadline_s
                )
                if outcome != "returned":
                    self._failed(ext, "observe_chat_response", outcome, detail)

    def stats(self) -> dict[str, Any]:
        """The `extensions` section of /v1/diagnostics/node."""
        report = discovery_report(self.extensions)
        for entry in report["loaded"]:
            entry["counters"] = {
                hook: counters.wire()
                for (name, hook), counters in sorted(self._counters.items())
                if name == entry["name"]
            }
        return {
            **report,
            "observerQueue": {
                "depth": self._queue.qsize(),
                "capacity": self._capacity,
                "dropped": self.observer_dropped,
            },
            "capabilityTags": sorted(self.context.capabilities()),
            "startHooksDone": self.started,
        }


async def _wait_until(condition: Callable[[], bool], deadline_s: float, poll_s: float) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline_s
    while not condition() and loop.time() < until:
        await asyncio.sleep(poll_s)
