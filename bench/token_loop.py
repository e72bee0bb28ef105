"""What the shared token loop costs per token: `skulk.worker.engines.token_loop.token_loop`
against the loop the llama.cpp and MLX engines each wrote inline before it (kept below,
verbatim in its bookkeeping, as the reference), side by side in one run.

Both run over the same scripted token source (no model: a model's forward pass would hide
the few hundred nanoseconds the loop itself costs), for a plain request and one with stop
strings. Contenders alternate per round so a shared machine's drift falls on both alike;
the load average is printed. The ratio token_loop/inline is what the refactor costs on the
decode hot path (1.00: nothing).

Usage: uv run python bench/token_loop.py [--tokens 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from skulk.worker.engines.base import (
    GeneratedToken,
    StopStringFilter,
    Utf8StreamDecoder,
    usage_of,
)
from skulk.worker.engines.token_loop import token_loop

VOCAB = [f" w{i}".encode() for i in range(1000)]
EOS = -1


def inline(next_token: Callable[[], int], n_prompt: int, max_new: int, stop: list[str],
           cancelled: threading.Event) -> Iterator[GeneratedToken]:
    """The pre-refactor llama.cpp engine loop (make = GeneratedToken, no think block)."""
    decoder = Utf8StreamDecoder()
    stops = StopStringFilter(stop)
    completion = 0
    first = True
    make = GeneratedToken
    cached = 0
    while True:
        token = next_token()
        if cancelled.is_set():
            return
        completion += 1
        if token == EOS:
            out = make(stops.flush(), token, "stop", usage_of(n_prompt, completion, cached))
        else:
            piece, matched = stops.push(decoder.decode(VOCAB[token]))
            if matched:
                out = replace(make(piece, token, "stop", usage_of(n_prompt, completion, cached)),
                              stop_sequence=stops.matched)
            elif completion >= max_new:
                out = make(piece + stops.flush(), token, "length", usage_of(n_prompt, completion, cached))
            else:
                out = make(piece, token, None, None)
        if first:
            out, first = replace(out, prompt_tokens=n_prompt), False
        yield out
        if out.finish_reason is not None:
            return


def shared(next_token: Callable[[], int], n_prompt: int, max_new: int, stop: list[str],
           cancelled: threading.Event) -> Iterator[GeneratedToken]:
    return token_loop(next_token, VOCAB.__getitem__, EOS.__eq__, n_prompt=n_prompt, max_new=max_new, stop=stop,
                      cancelled=cancelled)


def source(n: int) -> Callable[[], int]:
    counter = iter(range(n + 1))
    return lambda: next(counter) % 1000


def time_one(loop, tokens: int, stop: list[str]) -> float:
    cancelled = threading.Event()
    start = time.perf_counter_ns()
    count = sum(1 for _ in loop(source(tokens), 16, tokens, stop, cancelled))
    elapsed = time.perf_counter_ns() - start
    assert count == tokens
    return elapsed / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for label, stop in (("plain", []), ("stop strings", ["<|end|>", "\n\nUser:"])):
        results: dict[str, list[float]] = {"inline": [], "token_loop": []}
        for round_no in range(args.rounds):
            order = ("inline", "token_loop") if round_no % 2 == 0 else ("token_loop", "inline")
            for name in order:
                results[name].append(time_one(inline if name == "inline" else shared, args.tokens, stop))
        a, b = statistics.median(results["inline"]), statistics.median(results["token_loop"])
        print(f"{label:13s} inline {a:7.0f} ns/token   token_loop {b:7.0f} ns/token   ratio token_loop/inline {b / a:.3f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
