"""Bounded hand-off buffers: drop policies, wake-ups from foreign threads, closing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from skulk.routing.buffers import BufferClosed, FifoBuffer, LatestBuffer


async def test_fifo_drops_newest_when_full_and_counts() -> None:
    buffer: FifoBuffer[int] = FifoBuffer(asyncio.get_running_loop(), 2)
    assert [buffer.offer(i) for i in range(4)] == [True, True, False, False]
    assert buffer.stats() == {"depth": 2, "capacity": 2, "dropped": 2, "replaced": 0, "delivered": 0}
    assert [await buffer.get(), await buffer.get()] == [0, 1]
    assert buffer.offer(9)
    assert await buffer.get() == 9


async def test_latest_replaces_per_key_in_place_and_evicts_oldest_key_at_bound() -> None:
    buffer: LatestBuffer[str] = LatestBuffer(asyncio.get_running_loop(), 2)
    buffer.offer("a1", "a")
    buffer.offer("b1", "b")
    buffer.offer("a2", "a")  # replaces a1, keeps a's place in line
    assert (buffer.replaced, buffer.dropped) == (1, 0)
    buffer.offer("c1", "c")  # full: evicts the oldest key (a)
    assert (buffer.replaced, buffer.dropped) == (1, 1)
    assert [await buffer.get(), await buffer.get()] == ["b1", "c1"]


async def test_items_offered_from_another_thread_wake_the_waiting_consumer() -> None:
    buffer: FifoBuffer[int] = FifoBuffer(asyncio.get_running_loop(), 1000)
    received: list[int] = []

    async def consume() -> None:
        async for item in buffer:
            received.append(item)

    consumer = asyncio.create_task(consume())
    threads = [threading.Thread(target=lambda base=base: [buffer.offer(base + i) for i in range(100)]) for base in (0, 1000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    buffer.close()
    await asyncio.wait_for(consumer, 5)
    assert sorted(received) == [*range(100), *range(1000, 1100)]


async def test_close_lets_buffered_items_drain_then_ends() -> None:
    buffer: FifoBuffer[int] = FifoBuffer(asyncio.get_running_loop(), 4)
    buffer.offer(1)
    buffer.close()
    assert not buffer.offer(2)
    assert await buffer.get() == 1
    with pytest.raises(BufferClosed):
        await buffer.get()


async def test_close_wakes_a_waiting_consumer() -> None:
    buffer: FifoBuffer[int] = FifoBuffer(asyncio.get_running_loop(), 4)
    waiter = asyncio.create_task(buffer.get())
    await asyncio.sleep(0)
    threading.Thread(target=buffer.close).start()
    with pytest.raises(BufferClosed):
        await asyncio.wait_for(waiter, 5)


async def test_get_nowait_on_empty_raises_queue_empty() -> None:
    buffer: FifoBuffer[int] = FifoBuffer(asyncio.get_running_loop(), 1)
    with pytest.raises(asyncio.QueueEmpty):
        buffer.get_nowait()
