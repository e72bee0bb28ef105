"""What logit shaping costs the MLX engine: decode tok/s of one in-process MLX engine on the
tiny Llama, side by side in one run, for a plain greedy request and the same request with
logprobs (top 5), with logit bias + penalties, and under a JSON grammar (llguidance).

Shaped requests move each logits row to numpy on rank 0 (`TokenChooser`); this measures
what that costs per token against the lazy MLX sampler the plain path keeps. Contenders run
in rotating order per round so a shared machine's drift falls on all alike; the machine's
load average is printed before and after. The tiny model's forward pass is very cheap, so
the ratios here are the worst case (a real model's forward pass dwarfs the shaping).

Usage: uv run python bench/mlx_shaping.py [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.worker.engines.mlx_ranks import local_instance

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.tasks import ResponseFormat, TextGenerationParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.mlx.engine import MlxEngine

PROMPT = "the the the the"


def contenders(tokens: int, model_id: str) -> dict[str, TextGenerationParams]:
    base = {"model_id": model_id, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.0}
    return {
        "plain": TextGenerationParams(**base),
        "logprobs": TextGenerationParams(**base, logprobs=True, top_logprobs=5),
        "bias+penalty": TextGenerationParams(**base, logit_bias={7: 1.5}, presence_penalty=0.5,
                                             frequency_penalty=0.5),
        # A string that never closes keeps the grammar busy for every token.
        "json grammar": TextGenerationParams(**{**base, "prompt": '{"a": "'},
                                             response_format=ResponseFormat(type="json_object")),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")

    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_local_model(card, Path(tmp))
        instance = local_instance(card, 1)
        engine = MlxEngine()
        engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                              model_path=str(path)))
        engine.warm_up()
        requests = contenders(args.tokens, str(card.model_id))
        rates: dict[str, list[float]] = {name: [] for name in requests}
        names = list(requests)
        for round_index in range(args.rounds):
            for name in names[round_index % len(names):] + names[: round_index % len(names)]:
                started = time.perf_counter()
                produced = sum(1 for _ in engine.generate(requests[name], threading.Event()))
                rates[name].append(produced / (time.perf_counter() - started))
        engine.close()
    plain = statistics.median(rates["plain"])
    print(f"{'request':<14} {'tok/s (median)':>15} {'vs plain':>9}")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:<14} {rate:>15.1f} {rate / plain:>9.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
