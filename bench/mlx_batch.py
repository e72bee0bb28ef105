"""What continuous batching buys a single-rank MLX runner: aggregate decode tok/s on the tiny
Llama through the real engine, in one run, for 1 stream and for N concurrent streams on the
default (batched) engine, beside 1 stream on an unbatched (width 1) engine, the path every
request took before batching was on by default.

Each stream is a greedy request of `--tokens` tokens on its own prompt; a round runs every
contender once, in rotating order, after one unmeasured warm-up round, so a shared machine's
drift falls on all alike. Aggregate tok/s is every stream's tokens over the wall time from the
first submit to the last token. The ratio printed is N-stream aggregate / 1-stream (batched
engine; the issue's target is >= 2x at 4 streams). Bounded: `--rounds` rounds, each request
at most `--tokens` tokens, and no new round starts after `--deadline-s`. The machine's load
average is printed before and after. The tiny model's forward pass is very cheap, so the
per-step Python work dominates here; on a real model a step is bound by reading the weights,
which a batch reads once for all its streams.

Usage: uv run python bench/mlx_batch.py [--tokens 128] [--streams 4] [--rounds 3] [--deadline-s 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.worker.engines.mlx_ranks import local_instance

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.mlx.batch import BATCH_WIDTH_ENV
from skulk.worker.engines.mlx.engine import MlxEngine

PROMPTS = (
    "the the the the",
    "It rained again on Thursday and the",
    "The cluster by the sea",
    "What is a node?",
    "a b a b a b",
    "Once upon a time",
    "Tell me about the ships",
    "Numbers: one two three",
)
STREAM_JOIN_S = 120.0
"""Longest one contender's streams may take before the bench gives up on it (a hang guard)."""


def load(card: ModelCard, path: Path, width: str | None) -> MlxEngine:
    previous = os.environ.pop(BATCH_WIDTH_ENV, None)
    if width is not None:
        os.environ[BATCH_WIDTH_ENV] = width
    try:
        instance = local_instance(card, 1)
        engine = MlxEngine()
        engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                              model_path=str(path)))
    finally:
        os.environ.pop(BATCH_WIDTH_ENV, None)
        if previous is not None:
            os.environ[BATCH_WIDTH_ENV] = previous
    engine.warm_up()
    return engine


def aggregate_rate(engine: MlxEngine, requests: list[TextGenerationParams]) -> float:
    """Tokens per second over all `requests` run at once (one thread each)."""
    counts = [0] * len(requests)
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        try:
            counts[i] = sum(1 for _ in engine.generate(requests[i], threading.Event()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(requests))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(STREAM_JOIN_S)
    elapsed = time.perf_counter() - started
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"a stream failed or hung: {errors}")
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    args = parser.parse_args()
    streams = max(1, min(args.streams, len(PROMPTS)))
    print(f"load average before: {os.getloadavg()}")
    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")

    def requests(n: int) -> list[TextGenerationParams]:
        return [TextGenerationParams(model_id=card.model_id, prompt=p, max_tokens=args.tokens, temperature=0.0)
                for p in PROMPTS[:n]]

    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_local_model(card, Path(tmp))
        batched, unbatched = load(card, path, None), load(card, path, "1")
        try:
            print(f"batched engine width {batched.concurrency}, unbatched width {unbatched.concurrency}")
            contenders: dict[str, Callable[[], float]] = {
                "unbatched, 1 stream": lambda: aggregate_rate(unbatched, requests(1)),
                "batched, 1 stream": lambda: aggregate_rate(batched, requests(1)),
                f"batched, {streams} streams": lambda: aggregate_rate(batched, requests(streams)),
            }
            names = list(contenders)
            for name in names:  # warm-up round, unmeasured
                contenders[name]()
            rates: dict[str, list[float]] = {name: [] for name in names}
            deadline = time.monotonic() + args.deadline_s
            for round_index in range(args.rounds):
                if time.monotonic() > deadline:
                    print(f"deadline reached after {round_index} rounds")
                    break
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    rates[name].append(contenders[name]())
        finally:
            batched.close()
            unbatched.close()
    medians = {name: statistics.median(values) for name, values in rates.items() if values}
    print(f"{'contender':<24} {'aggregate tok/s (median)':>25}  rounds")
    for name, rate in medians.items():
        print(f"{name:<24} {rate:>25.1f}  {[round(v) for v in rates[name]]}")
    one, many = medians.get("batched, 1 stream"), medians.get(f"batched, {streams} streams")
    if one and many:
        print(f"{streams}-stream aggregate / 1-stream (batched engine): {many / one:.2f}x")
    if one and medians.get("unbatched, 1 stream"):
        print(f"1 stream, batched / unbatched engine: {one / medians['unbatched, 1 stream']:.2f}x")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
