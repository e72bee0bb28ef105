"""Continuous batching for a single-rank MLX instance: concurrent requests share decode steps.

One thread owns an mlx-lm `BatchGenerator` (which is not thread-safe) and runs its steps while
any sequence is active; requests join and leave between steps through a command queue. Each
request gets its own output queue of (token, finish_reason) pairs, bounded by the request's
own max_tokens (the generator never produces more), and its own `Sampler` (or `TokenChooser`),
so seeded and shaped requests keep their own PRNG key, grammar, penalties and logprobs
whoever shares the batch. A shaped request's `TokenChooser` gets its row of the raw logits,
as on the unbatched path, not the generator's normalised log-probabilities: llama.cpp's repeat
penalty divides a positive logit and multiplies a negative one, so it would change meaning on
values that are all negative. A plain `Sampler` (temperature, top-k and top-p, all unchanged
by a constant shift) samples the log-probabilities, sparing every step the logits processor
that keeps the raw rows; plain greedy requests have no sampler of their own (argmax is
stateless): the generator picks every greedy row with one batched argmax. End-of-generation, stop strings and cancellation stay with the
requester (the engine's dispatcher thread), which removes its sequence when it is done: the
loop never decides when a client's stream ends.

With a prefix store, a joining request starts from the longest cold prefix of its prompt (the
generator merges that KV into its batch cache and evaluates only the rest), and a sequence
that leaves, finished or removed, offers its KV to the store for later requests. Both happen
on the loop's thread in command order, so a follow-up sent after a request's stream ended
always finds that request's KV (a finished sequence is offered before its last token goes
out; a requester queues its removal before its stream ends).

A sampler that raises (a grammar the model escaped) fails its own request only: the loop
hands that sequence a placeholder token, delivers the error to its requester and removes
it, so its batch neighbours never see it. A generator that raises fails every request and
the engine (`EngineBroken`). Idle, the loop blocks on its command queue: no wake-ups.

Groups (pipeline or tensor) never batch: their ranks must step in lockstep on one request.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from skulk.shared.settings import setting
from skulk.worker.engines.base import EngineBroken

if TYPE_CHECKING:
    from skulk.worker.engines.mlx.prefix import MlxPrefixStore

log = logging.getLogger(__name__)

BATCH_WIDTH_ENV = "SKULK_MLX_BATCH_WIDTH"
DEFAULT_BATCH_WIDTH = 8
"""Concurrent generations per single-rank MLX runner; 1 turns batching off. A decode step on
Apple silicon is bound by reading the weights, which a batch reads once for all its sequences,
so up to a handful of sequences share a step for little more than one costs (mlx-lm's own
server prefills 8 prompts at a time, and decodes up to 32). 8 bounds how many prompts one
prefill takes on (joiners are prefilled between decode steps, which stalls the others for
that long) and the KV in flight at 8 live sequences: MLX's KV grows with the tokens actually held, but
placement reserves one context window per runner, so 8 long requests at once can hold more
KV than placement planned. Batched greedy tokens match the unbatched path's on the tiny model;
on a real model a batch's padded, wider matmuls may change the last bits of a logit, and so
a near-tie, against the same request served alone."""

MAX_BATCH_WIDTH = 64
"""Above this a setting is treated as a typo and clamped."""

Command = tuple[Literal["insert", "remove", "close"], "BatchSequence | None"]


@dataclass
class BatchSequence:
    """One request inside the batch, as its requester sees it."""

    prompt: list[int]
    max_tokens: int
    sampler: Callable[[Any], Any] | None
    """The request's `Sampler`, its `TokenChooser` when it shapes the logits, or None for plain
    greedy decoding (the generator's own batched argmax)."""
    raw_logits: bool = False
    """Sample from the raw logits row (a `TokenChooser`), not the log-probabilities."""
    out: queue.Queue[tuple[int, str | None] | BaseException] = field(default_factory=queue.Queue)
    """(token, finish_reason) pairs, or the exception that ended this sequence (its own
    sampler's) or the whole loop (`EngineBroken`)."""
    uid: int | None = None
    cached: int = 0
    """Prompt tokens whose KV came from the prefix store; set when the sequence joins, so
    final by the time its first token is out."""
    error: BaseException | None = None
    """Raised by this sequence's sampler inside a step; delivered once that step is done."""
    logits: Any = None
    """This step's raw logits row (1, vocab), kept for a `raw_logits` sampler by a logits
    processor."""


def batch_width(env: Mapping[str, str]) -> int:
    """The width a setting asks for (the default when unset or malformed), within 1..MAX."""
    raw = setting(BATCH_WIDTH_ENV, env)
    try:
        width = int(raw) if raw.strip() else DEFAULT_BATCH_WIDTH
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", BATCH_WIDTH_ENV, raw, DEFAULT_BATCH_WIDTH)
        width = DEFAULT_BATCH_WIDTH
    return max(1, min(MAX_BATCH_WIDTH, width))


def batchable(cache: list[Any]) -> bool:
    """Whether mlx-lm's `BatchGenerator` can batch a model whose fresh prompt cache is `cache`:
    every layer's cache type must merge into a batch cache (the test mlx-lm's own server uses;
    a quantized or chunked cache cannot)."""
    return all(hasattr(layer, "merge") for layer in cache)


class BatchLoop:
    def __init__(self, model: Any, width: int, *, prefixes: MlxPrefixStore | None = None,
                 prefill_step_tokens: int = 2048, make_cache: Callable[[], list[Any]] | None = None) -> None:
        self._model = model
        self._make_cache = make_cache
        """A fresh cache for a joining sequence with no lent prefix (None: the generator's own,
        mlx-lm's plain one; a quantized placement's cache must be passed in)."""
        self._width = width
        self._prefixes = prefixes
        self._prefill_step_tokens = prefill_step_tokens
        self._commands: queue.Queue[Command] = queue.Queue()
        self._active: dict[int, BatchSequence] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlx-batch", daemon=True)
        self._thread.start()

    def submit(self, sequence: BatchSequence) -> BatchSequence:
        """Queue `sequence` to join the batch (from the prefix store's best prefix)."""
        if self._closed.is_set():
            raise EngineBroken("the MLX batch loop is closed")
        self._commands.put(("insert", sequence))
        return sequence

    def remove(self, sequence: BatchSequence) -> None:
        """Idempotent; the sequence produces nothing more after the next step."""
        self._commands.put(("remove", sequence))

    def close(self, timeout_s: float = 5.0) -> None:
        self._closed.set()
        self._commands.put(("close", None))  # wakes an idle loop
        self._thread.join(timeout_s)

    def _run(self) -> None:
        from mlx_lm.generate import BatchGenerator

        generator = BatchGenerator(self._model, completion_batch_size=self._width, prefill_batch_size=self._width,
                                   prefill_step_size=self._prefill_step_tokens)
        ended: BaseException = EngineBroken("the MLX engine closed")
        try:
            while not self._closed.is_set():
                self._take_commands(generator, block=not self._active)
                if not self._active:
                    continue
                for response in generator.next_generated():
                    sequence = self._active.get(response.uid)
                    if sequence is None:
                        continue
                    if response.finish_reason is not None:
                        del self._active[response.uid]
                        if response.prompt_cache is not None and response.all_tokens is not None:
                            self._keep(response.all_tokens, response.prompt_cache)
                    sequence.out.put((int(response.token), response.finish_reason))
                for sequence in [s for s in self._active.values() if s.error is not None]:
                    assert sequence.error is not None
                    sequence.out.put(sequence.error)
                    self._drop(generator, sequence)
        except Exception as exc:  # a broken generator must end every stream, not hang them
            log.exception("MLX batch loop failed")
            ended = EngineBroken(f"the MLX batch loop failed: {exc}")
        finally:
            self._closed.set()
            for sequence in self._active.values():
                sequence.out.put(ended)
            self._active.clear()
            while True:  # requests submitted as the loop ended never joined: end them too
                try:
                    kind, sequence = self._commands.get_nowait()
                except queue.Empty:
                    break
                if kind == "insert" and sequence is not None:
                    sequence.out.put(ended)
            generator.close()

    def _take_commands(self, generator: Any, block: bool) -> None:
        """Apply every queued command; when `block`, wait (without a timeout: close() sends
        one) for the first."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, sequence = command
            if kind == "close":
                self._closed.set()
            elif kind == "insert" and sequence is not None:
                prefixes = self._prefixes
                cache, sequence.cached = prefixes.lend(sequence.prompt) if prefixes is not None else (None, 0)
                if cache is None and self._make_cache is not None:
                    cache = self._make_cache()
                (uid,) = generator.insert(
                    [sequence.prompt[sequence.cached:]], max_tokens=[sequence.max_tokens],
                    caches=[cache], all_tokens=[list(sequence.prompt[: sequence.cached])],
                    logits_processors=[[lambda _context, logits, s=sequence: self._keep_logits(s, logits)]
                                       if sequence.raw_logits else []],
                    samplers=[None if sequence.sampler is None else
                              lambda logprobs, s=sequence: self._sample(s, logprobs)],
                )
                sequence.uid = uid
                self._active[uid] = sequence
            elif sequence is not None and sequence.uid is not None and sequence.uid in self._active:
                self._drop(generator, sequence)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _drop(self, generator: Any, sequence: BatchSequence) -> None:
        """Take `sequence` out of the batch, offering its KV to the prefix store."""
        assert sequence.uid is not None
        returned = generator.remove([sequence.uid], return_prompt_caches=self._prefixes is not None)
        del self._active[sequence.uid]
        for cache, tokens in returned.values():
            self._keep(tokens, cache)

    def _keep(self, tokens: list[int], cache: list[Any]) -> None:
        """Best effort: a prefix the store could not save costs a later request a prefill,
        never this batch its loop."""
        if self._prefixes is None:
            return
        try:
            self._prefixes.keep(tokens, cache)
        except Exception:
            log.exception("MLX batch: a finished sequence's KV was not kept for prefix reuse")

    @staticmethod
    def _keep_logits(sequence: BatchSequence, logits: Any) -> Any:
        """A logits processor that changes nothing: the generator calls it with the raw row
        just before it normalises and samples the step."""
        sequence.logits = logits
        return logits

    @staticmethod
    def _sample(sequence: BatchSequence, logprobs: Any) -> Any:
        """One sequence's next token from its row (raw logits or log-probabilities, shape
        (1, vocab)). Its sampler's failure is kept for its own requester; the step goes on
        with token 0 in its place (the sequence leaves before that token is delivered)."""
        import mlx.core as mx

        row, sequence.logits = (sequence.logits if sequence.raw_logits else logprobs), None
        if sequence.error is None and sequence.sampler is not None:
            try:
                return sequence.sampler(row[0])
            except Exception as exc:
                sequence.error = exc
        return mx.zeros((1,), dtype=mx.int32)


__all__ = ["BATCH_WIDTH_ENV", "DEFAULT_BATCH_WIDTH", "MAX_BATCH_WIDTH", "BatchLoop", "BatchSequence", "batch_width",
           "batchable"]
