"""The hook guard: what a transform's outcome does to its request (pure tables), and the
runtime carrying it out: deadlines, policies, sync hooks off the loop, the bounded
observer queue, the start hooks."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from skulk.extensions.context import ExtensionContext
from skulk.extensions.contract import shape_of
from skulk.extensions.loader import ExtensionSet, LoadedExtension
from skulk.extensions.middleware import ExtensionRefused, ExtensionRuntime, checked_params, verdict
from skulk.extensions.summary import summarise
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams

PARAMS = TextGenerationParams(model_id=ModelId("m"), messages=[ChatMessage(role="user", content="hi")])


@pytest.mark.parametrize(
    ("policy", "outcome", "expected"),
    [
        ("skip", "returned", "apply"),
        ("fail", "returned", "apply"),
        ("skip", "raised", "skip"),
        ("skip", "timed_out", "skip"),
        ("skip", "invalid", "skip"),
        ("fail", "raised", "fail"),
        ("fail", "timed_out", "fail"),
        ("fail", "invalid", "fail"),
    ],
)
def test_verdict(policy: Any, outcome: Any, expected: str) -> None:
    assert verdict(policy, outcome) == expected


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (None, PARAMS),
        (PARAMS.model_copy(update={"temperature": 0.5}), PARAMS.model_copy(update={"temperature": 0.5})),
        ({"model_id": "m"}, "returned dict, not TextGenerationParams"),
        (PARAMS.model_copy(update={"model_id": ModelId("other")}), "changed model_id from 'm' to 'other'"),
        (PARAMS.model_copy(update={"messages": []}), "returned invalid params"),
        (PARAMS.model_copy(update={"max_tokens": 0}), "returned invalid params: max_tokens"),
    ],
)
def test_checked_params(returned: object, expected: TextGenerationParams | str) -> None:
    checked = checked_params(PARAMS, returned)
    if isinstance(expected, str):
        assert isinstance(checked, str) and expected in checked
    else:
        assert checked == expected


class Ext:
    version = "1"
    skulk_versions = ">=0"

    def __init__(self, name: str, policy: str = "skip", **hooks: Any) -> None:
        self.name = name
        self.failure_policy = policy
        for hook, fn in hooks.items():
            setattr(self, hook, fn)


def _runtime(*objs: Ext, **kw: Any) -> ExtensionRuntime:
    loaded = tuple(LoadedExtension(shape=shape_of(o), obj=o, entry_point=f"{o.name} = x:y") for o in objs)
    return ExtensionRuntime(ExtensionSet(loaded=loaded), ExtensionContext(node_id="n", node_name="node"), **kw)


def _system(text: str):
    def transform(params: TextGenerationParams, ctx: ExtensionContext) -> TextGenerationParams:
        return params.model_copy(update={"messages": [ChatMessage(role="system", content=text), *params.messages]})

    return transform


async def test_transforms_chain_in_load_order_and_sync_ones_run_off_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def first(params: TextGenerationParams, ctx: ExtensionContext) -> TextGenerationParams:
        threads.append(threading.get_ident())
        return _system("one")(params, ctx)

    async def second(params: TextGenerationParams, ctx: ExtensionContext) -> TextGenerationParams:
        return _system("two")(params, ctx)

    runtime = _runtime(Ext("a", transform_chat_request=first), Ext("b", transform_chat_request=second))
    out = await runtime.transform_chat_request(PARAMS)
    assert [m.content for m in out.messages] == ["two", "one", "hi"]
    assert threads and threads[0] != loop_thread


async def test_a_prompt_request_is_not_a_chat_request() -> None:
    runtime = _runtime(Ext("a", transform_chat_request=_system("x")))
    prompt = TextGenerationParams(model_id=ModelId("m"), prompt="raw")
    assert await runtime.transform_chat_request(prompt) is prompt


def _boom(params: TextGenerationParams, ctx: ExtensionContext) -> None:
    raise RuntimeError("boom")


async def _slow(params: TextGenerationParams, ctx: ExtensionContext) -> None:
    await asyncio.sleep(30)


@pytest.mark.parametrize(
    ("hook", "counter"), [(_boom, "failures"), (_slow, "timeouts"), (lambda p, c: "nonsense", "failures")]
)
async def test_a_skip_policy_failure_leaves_the_request_untransformed(hook: Any, counter: str) -> None:
    runtime = _runtime(Ext("a", transform_chat_request=hook), transform_deadline_s=0.05)
    assert await runtime.transform_chat_request(PARAMS) == PARAMS
    counters = runtime.stats()["loaded"][0]["counters"]["transform_chat_request"]
    assert counters["calls"] == 1 and counters[counter] == 1


@pytest.mark.parametrize(("hook", "reason"), [(_boom, "RuntimeError: boom"), (_slow, "did not return within")])
async def test_a_fail_policy_failure_refuses_the_request(hook: Any, reason: str) -> None:
    runtime = _runtime(Ext("gate", "fail", transform_chat_request=hook), transform_deadline_s=0.05)
    with pytest.raises(ExtensionRefused) as refused:
        await runtime.transform_chat_request(PARAMS)
    assert refused.value.extension == "gate" and reason in refused.value.reason


async def test_hung_sync_hooks_cost_bounded_daemon_threads_and_end_as_timeouts() -> None:
    release = threading.Event()
    entered: list[int] = []

    def hang(params: TextGenerationParams, ctx: ExtensionContext) -> None:
        entered.append(1)
        release.wait(30)

    runtime = _runtime(Ext("a", transform_chat_request=hang), transform_deadline_s=0.1, hook_threads=2)
    try:
        for _ in range(4):
            assert await runtime.transform_chat_request(PARAMS) == PARAMS  # skipped: timed out
        hung = [t for t in threading.enumerate() if t.name == "extension-hook-hang"]
        assert len(entered) == 2 and len(hung) == 2 and all(t.daemon for t in hung)
        assert runtime.stats()["loaded"][0]["counters"]["transform_chat_request"]["timeouts"] == 4
    finally:
        release.set()
    await _until(lambda: not any(t.name == "extension-hook-hang" for t in threading.enumerate()))
    # The threads are free again: the next call runs (and, released, returns in time).
    assert await runtime.transform_chat_request(PARAMS) == PARAMS
    assert len(entered) == 3


async def _until(condition: Any, deadline_s: float = 5.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_start_hooks_wait_for_the_api_then_observers_get_every_summary() -> None:
    seen: list[str] = []
    started: list[str] = []
    api_up = False

    def observe(summary: Any, ctx: ExtensionContext) -> None:
        seen.append(summary.request_id)

    def on_start(ctx: ExtensionContext) -> None:
        ctx.advertise_capability("audit")
        started.append(ctx.node_id)

    runtime = _runtime(
        Ext("a", observe_chat_response=observe, on_start=on_start), Ext("b", observe_chat_response=_boom)
    )
    task = asyncio.create_task(runtime.run(lambda: api_up, poll_s=0.01))
    try:
        await asyncio.sleep(0.05)
        assert started == []  # the API is not up yet
        api_up = True
        await _until(lambda: runtime.started)
        assert started == ["n"] and runtime.stats()["capabilityTags"] == ["audit"]
        for i in range(3):
            runtime.observe_chat_response(summarise([], request_id=f"r{i}", model_id="m", wire="openai.chat"))
        await _until(lambda: len(seen) == 3)
        assert seen == ["r0", "r1", "r2"]
        await _until(lambda: runtime.stats()["loaded"][1]["counters"]["observe_chat_response"]["failures"] == 3)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_full_observer_queue_drops_and_counts() -> None:
    runtime = _runtime(Ext("a", observe_chat_response=lambda s, c: None), queue_capacity=2)
    for i in range(5):  # nothing drains: the runtime's task is not running
        runtime.observe_chat_response(summarise([], request_id=f"r{i}", model_id="m", wire="openai.chat"))
    assert runtime.stats()["observerQueue"] == {"depth": 2, "capacity": 2, "dropped": 3}


async def test_no_extensions_means_nothing_runs() -> None:
    runtime = _runtime()
    assert not runtime.transforms and not runtime.observes
    assert await runtime.transform_chat_request(PARAMS) is PARAMS
    runtime.observe_chat_response(summarise([], request_id="r", model_id="m", wire="openai.chat"))
    assert runtime.stats()["observerQueue"]["depth"] == 0
