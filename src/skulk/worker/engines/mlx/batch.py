"""Continuous batching for a single-rank MLX instance: concurrent requests share decode steps.

One thread owns an mlx-lm `BatchGenerator` (which is not thread-safe) and runs its steps while
any sequence is active; requests join and leave between steps through a command queue. Each
request gets its own output queue of (token, finish_reason) pairs, bounded by the request's
own max_tokens (the generator never produces more), and its own `Sampler`, so seeded requests
stay reproducible whoever shares the batch. End-of-generation, stop strings and cancellation
stay with the requester (the engine's dispatcher thread), which removes its sequence when it
is done: the loop never decides when a client's stream ends.

Groups (pipeline or tensor) never batch: their ranks must step in lockstep on one request.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BATCH_WIDTH_ENV = "SKULK_MLX_BATCH_WIDTH"
DEFAULT_BATCH_WIDTH = 1
"""Concurrent generations per single-rank MLX runner. 1 (no batching) until batched numerics
are validated on real models: a batch pads prompts and changes matmul shapes, so its greedy
tokens are not guaranteed bit-equal to the unbatched path's (they are on the tiny model)."""

MAX_BATCH_WIDTH = 64

IDLE_POLL_S = 0.5
"""How long the idle loop blocks on its command queue before re-checking for close."""


@dataclass
class BatchSequence:
    """One request inside the batch, as its requester sees it."""

    prompt: list[int]
    max_tokens: int
    sampler: Callable[[Any], Any]
    """The request's `Sampler`, or its `TokenChooser` when it shapes the logits."""
    out: queue.Queue = field(default_factory=queue.Queue)
    """(token, finish_reason) pairs, or an Exception that ended the loop."""
    uid: int | None = None


class BatchLoop:
    def __init__(self, model: Any, width: int) -> None:
        self._model = model
        self._width = width
        self._commands: queue.Queue[tuple[str, BatchSequence]] = queue.Queue()
        self._active: dict[int, BatchSequence] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlx-batch", daemon=True)
        self._thread.start()

    def submit(self, sequence: BatchSequence) -> BatchSequence:
        if self._closed.is_set():
            raise RuntimeError("the batch loop is closed")
        self._commands.put(("insert", sequence))
        return sequence

    def remove(self, sequence: BatchSequence) -> None:
        """Idempotent; the sequence produces nothing more after the next step."""
        self._commands.put(("remove", sequence))

    def close(self, timeout_s: float = 5.0) -> None:
        self._closed.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        from mlx_lm.generate import BatchGenerator

        generator = BatchGenerator(self._model, completion_batch_size=self._width, prefill_batch_size=self._width)
        try:
            while not self._closed.is_set():
                self._take_commands(generator, block=not self._active)
                if not self._active:
                    continue
                for response in generator.next_generated():
                    sequence = self._active.get(response.uid)
                    if sequence is None:
                        continue
                    sequence.out.put((int(response.token), response.finish_reason))
                    if response.finish_reason is not None:
                        del self._active[response.uid]
        except Exception as exc:  # a broken generator must end every stream, not hang them
            log.exception("MLX batch loop failed")
            for sequence in self._active.values():
                sequence.out.put(exc)
            self._closed.set()
        finally:
            generator.close()

    def _take_commands(self, generator: Any, block: bool) -> None:
        try:
            command, sequence = self._commands.get(timeout=IDLE_POLL_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if command == "insert":
                sampler = sequence.sampler
                (uid,) = generator.insert([sequence.prompt], max_tokens=[sequence.max_tokens],
                                          samplers=[lambda logprobs, s=sampler: s(logprobs[0])])
                sequence.uid = uid
                self._active[uid] = sequence
            elif sequence.uid is not None and sequence.uid in self._active:
                generator.remove([sequence.uid])
                del self._active[sequence.uid]
            try:
                command, sequence = self._commands.get_nowait()
            except queue.Empty:
                return


def batch_width(env: Any) -> int:
    raw = env.get(BATCH_WIDTH_ENV, "")
    try:
        width = int(raw) if raw.strip() else DEFAULT_BATCH_WIDTH
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", BATCH_WIDTH_ENV, raw, DEFAULT_BATCH_WIDTH)
        width = DEFAULT_BATCH_WIDTH
    return max(1, min(MAX_BATCH_WIDTH, width))


__all__ = ["BATCH_WIDTH_ENV", "DEFAULT_BATCH_WIDTH", "BatchLoop", "BatchSequence", "batch_width"]
