"""The llama.cpp engine's cold prefix store: KV of earlier conversations kept in host RAM.

llama.cpp's context holds one hot sequence (sequence 0). Before a request overwrites it, its
KV is copied out with `llama_state_seq_get_data` (only that sequence's cells, not the
logits or the whole context state that `Llama.save_state` copies), and when a later prompt
extends a saved sequence its bytes go back with `llama_state_seq_set_data`. Which entry to
use and what to evict is decided by `prefix_cache` (pure); this class only moves bytes and
keeps `Llama`'s token bookkeeping (`input_ids`, `n_tokens`) in step with the KV it holds.

A restore that llama.cpp refuses (size mismatch, a context too small) clears the context
and the request is evaluated from scratch: never decoding on KV that is not the prompt's.
Not thread-safe: the engine calls it under its one-generation lock.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from skulk.shared.prefix_cache import CachedPrefix, PrefixStats, admit, choose_prefix, touch

log = logging.getLogger(__name__)

SEQ = 0
"""The one sequence the engine decodes on."""


class LlamaPrefixStore:
    """Cold KV entries for one `Llama` context, within `budget_bytes` of host RAM."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.stats = PrefixStats()
        self._entries: tuple[CachedPrefix, ...] = ()
        self._blobs: dict[int, bytes] = {}
        self._clock = 0
        self._next_key = 0

    @property
    def entries(self) -> tuple[CachedPrefix, ...]:
        return self._entries

    def prepare(self, llama: Any, prompt: Sequence[int]) -> int:
        """Make the context hold the best cached prefix of `prompt` (saving the hot
        sequence first when the request would overwrite it), trim what does not match, and
        return how many prompt tokens are already evaluated."""
        self._clock += 1
        hot = llama.input_ids[: llama.n_tokens].tolist()
        cold = self._entries if self.budget_bytes > 0 else ()
        choice = choose_prefix(prompt, hot, cold)
        if choice.save_hot and self.budget_bytes > 0:
            self.save_hot(llama)
        reused = choice.reused_tokens
        if choice.source == "cold" and choice.entry_key is not None:
            if self._restore(llama, choice.entry_key):
                self.stats.cold_hit_tokens += reused
            else:
                reused = 0
        elif choice.source == "hot":
            self.stats.hot_hit_tokens += reused
        return self._trim(llama, reused)

    def save_hot(self, llama: Any) -> None:
        """Copy the hot sequence's KV into the store (if it fits the budget)."""
        import llama_cpp

        n = llama.n_tokens
        if n <= 0 or self.budget_bytes <= 0:
            return
        ctx = llama._ctx.ctx
        seq = llama_cpp.llama_seq_id(SEQ)  # the ctypes type the bindings declare (ctypes takes either)
        size = llama_cpp.llama_state_seq_get_size(ctx, seq)
        if size <= 0 or size > self.budget_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, seq)
        if written <= 0:
            return
        key = self._next_key
        self._next_key += 1
        entry = CachedPrefix(key, tuple(llama.input_ids[:n].tolist()), int(written), self._clock)
        admission = admit(self._entries, entry, self.budget_bytes)
        if not admission.admitted:
            return
        self._blobs[key] = ctypes.string_at(buffer, written)
        for gone in admission.evicted:
            self._blobs.pop(gone, None)
        self.stats.evictions += len(admission.evicted)
        self._entries = admission.kept
        self.stats.saves += 1
        self._update_sizes()

    def clear(self) -> None:
        self._entries = ()
        self._blobs.clear()
        self._update_sizes()

    def _restore(self, llama: Any, key: int) -> bool:
        import llama_cpp

        entry = next((e for e in self._entries if e.key == key), None)
        blob = self._blobs.get(key)
        if entry is None or blob is None:
            return False
        ctx = llama._ctx.ctx
        memory = llama_cpp.llama_get_memory(ctx)
        if memory is None:  # a context always has its memory; evaluating from scratch is the safe answer
            return False
        llama_cpp.llama_memory_clear(memory, True)
        llama.n_tokens = 0
        buffer = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        read = llama_cpp.llama_state_seq_set_data(ctx, buffer, len(blob), llama_cpp.llama_seq_id(SEQ))
        if read != len(blob):
            log.warning("llama.cpp refused a cold KV entry (%d of %d bytes read); evaluating from scratch",
                        read, len(blob))
            llama_cpp.llama_memory_clear(memory, True)
            llama.reset()
            return False
        n = len(entry.tokens)
        llama.input_ids[:n] = entry.tokens
        llama.n_tokens = n
        llama._requires_eval = True  # the logits are not this KV's: evaluate before sampling
        self._entries = touch(self._entries, key, self._clock)
        self.stats.restores += 1
        return True

    def trim(self, llama: Any, keep: int) -> int:
        """Drop the context's tokens past `keep` (an engine cutting a reused prefix back to
        a boundary of its own, such as an image's start); the kept count."""
        return self._trim(llama, keep)

    @staticmethod
    def _trim(llama: Any, keep: int) -> int:
        """Drop the context's tokens past `keep`; the kept count (0 if trimming failed)."""
        if keep >= llama.n_tokens:
            return llama.n_tokens
        if keep > 0 and llama._ctx.kv_cache_seq_rm(-1, keep, -1):
            llama.n_tokens = keep
            return keep
        llama.reset()
        import llama_cpp

        memory = llama_cpp.llama_get_memory(llama._ctx.ctx)
        if memory is not None:
            llama_cpp.llama_memory_clear(memory, True)
        return 0

    def _update_sizes(self) -> None:
        self.stats.cold_entries = len(self._entries)
        self.stats.cold_bytes = sum(e.size_bytes for e in self._entries)


__all__ = ["SEQ", "LlamaPrefixStore"]
