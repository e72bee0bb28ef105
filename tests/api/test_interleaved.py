"""`interleaved`: several choices' outputs merged as their chunks arrive; a failing or
abandoned merge closes every output (their cleanup cancels the other choices' commands)."""

from __future__ import annotations

import asyncio

import pytest

from skulk.api.generation import interleaved


def output(name: str, items: list[str], closed: list[str], gate: asyncio.Event | None = None,
           fail: bool = False):
    async def gen():
        try:
            for item in items:
                if gate is not None:
                    await gate.wait()
                yield f"{name}:{item}"
            if fail:
                raise RuntimeError(f"{name} broke")
        finally:
            closed.append(name)

    return gen()


async def test_chunks_come_with_their_index_and_each_end_is_reported():
    closed: list[str] = []
    got = [x async for x in interleaved([output("a", ["1", "2"], closed), output("b", ["1"], closed)])]
    assert [x for x in got if x[0] == 0] == [(0, "a:1"), (0, "a:2"), (0, None)]
    assert [x for x in got if x[0] == 1] == [(1, "b:1"), (1, None)]
    assert sorted(closed) == ["a", "b"]


async def test_a_failing_output_closes_the_others_even_mid_read():
    closed: list[str] = []
    never = asyncio.Event()  # b waits forever inside its read when a fails
    merged = interleaved([output("a", ["1"], closed, fail=True), output("b", ["1"], closed, gate=never)])
    with pytest.raises(RuntimeError, match="a broke"):
        async for _ in merged:
            pass
    assert sorted(closed) == ["a", "b"]


async def test_leaving_early_closes_every_output():
    closed: list[str] = []
    never = asyncio.Event()
    merged = interleaved([output("a", ["1", "2"], closed), output("b", ["1"], closed, gate=never)])
    first = await anext(merged)
    assert first == (0, "a:1")
    await merged.aclose()
    assert sorted(closed) == ["a", "b"]
