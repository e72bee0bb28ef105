"""Bounded hand-off from zenoh's callback threads to one asyncio event loop.

Zenoh calls subscribers on its own threads. Each receive stream gets one buffer here: the
callback thread `offer`s items under a lock and wakes the loop with at most one pending
`loop.call_soon_threadsafe` at a time, so neither the buffer nor the loop's ready queue can
grow past a bound however slow the consumer is. The drop decision is made on the callback
thread, immediately and exactly at the capacity.

Two policies:
- `FifoBuffer`: first in, first out; when full the newest item is dropped and counted.
- `LatestBuffer`: one slot per key; a new value for a key already waiting replaces it in
  place (counted as `replaced`); a new key at capacity evicts the oldest waiting key
  (counted as `dropped`).

This module must never block the callback thread (no awaiting, no waiting for space).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class BufferClosed(Exception):
    """The stream is closed and every item that was buffered has been taken."""


class _LoopBuffer(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._loop = loop
        self._capacity = capacity
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._wake_pending = False
        self._closed = False
        self.offered = 0
        self.dropped = 0
        self.replaced = 0
        self.taken = 0

    # -- subclass storage (called with the lock held) --
    def _store(self, item: T, key: Hashable) -> bool:
        raise NotImplementedError

    def _pop(self) -> T:
        raise NotImplementedError

    def _len(self) -> int:
        raise NotImplementedError

    # -- any thread --
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def closed(self) -> bool:
        return self._closed

    def qsize(self) -> int:
        with self._lock:
            return self._len()

    def offer(self, item: T, key: Hashable = None) -> bool:
        """Buffer `item`; False when it was dropped (full FIFO or closed). Never blocks."""
        with self._lock:
            if self._closed:
                return False
            self.offered += 1
            stored = self._store(item, key)
            wake = stored and not self._wake_pending
            if wake:
                self._wake_pending = True
        if wake:
            self._schedule_wake()
        return stored

    def close(self) -> None:
        """Stop accepting items and wake every waiter; buffered items can still be taken."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self._schedule_wake()

    def _schedule_wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            # The loop is closed (process shutting down): nobody is left to wake.
            pass

    # -- loop thread --
    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._ready.set()

    def get_nowait(self) -> T:
        """Take the next item; asyncio.QueueEmpty when none is waiting, BufferClosed at the end."""
        with self._lock:
            if self._len():
                self.taken += 1
                return self._pop()
            if self._closed:
                raise BufferClosed
        raise asyncio.QueueEmpty

    async def get(self) -> T:
        """Wait for the next item; BufferClosed once closed and drained."""
        while True:
            try:
                return self.get_nowait()
            except asyncio.QueueEmpty:
                pass
            self._ready.clear()
            # Re-check after clearing: an offer between the check and the clear already
            # scheduled its wake-up, which will set the event again.
            with self._lock:
                pending = self._len() > 0 or self._closed
            if not pending:
                await self._ready.wait()

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.get()
            except BufferClosed:
                return

    def stats(self) -> dict[str, int]:
        with self._lock:
            depth = self._len()
        return {
            "depth": depth,
            "capacity": self._capacity,
            "dropped": self.dropped,
            "replaced": self.replaced,
            "delivered": self.taken,
        }


class FifoBuffer(_LoopBuffer[T]):
    """FIFO; when full, the newest item is dropped and counted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        super().__init__(loop, capacity)
        self._items: deque[T] = deque()

    def _store(self, item: T, key: Hashable) -> bool:
        if len(self._items) >= self._capacity:
            self.dropped += 1
            return False
        self._items.append(item)
        return True

    def _pop(self) -> T:
        return self._items.popleft()

    def _len(self) -> int:
        return len(self._items)


class LatestBuffer(_LoopBuffer[T]):
    """Latest value per key; full buffers evict the oldest waiting key."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        super().__init__(loop, capacity)
        self._items: OrderedDict[Hashable, T] = OrderedDict()

    def _store(self, item: T, key: Hashable) -> bool:
        if key in self._items:
            self._items[key] = item  # keeps its place in line: a busy key cannot starve others
            self.replaced += 1
            return True
        if len(self._items) >= self._capacity:
            self._items.popitem(last=False)
            self.dropped += 1
        self._items[key] = item
        return True

    def _pop(self) -> T:
        return self._items.popitem(last=False)[1]

    def _len(self) -> int:
        return len(self._items)
