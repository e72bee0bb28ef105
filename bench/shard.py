"""MLX sharding benchmark: one model served by 1, 2 and 3 local ranks, figures from one run.

Every configuration runs as real rank processes on loopback (the same `MlxEngine` a runner
loads), decodes the same greedy requests, and must produce the tokens one rank does (the
benchmark refuses to print a ratio for a configuration that decodes something else).

Prints, per configuration (pipeline 1/2/3 ranks, tensor 2 ranks):
- decode tok/s and TTFT (first-token latency, prefill included), medians over the requests;
- bytes sent per generated token, summed over ranks (pipeline: activations and tokens as
  sent; tensor: the two all_sums per layer as the ring moves them);
- each figure's ratio against 1 rank.

On one machine every rank shares the same cores, so multi-rank figures measure the cost of
the protocol (serialised stages, collectives), not the capacity of more machines.

Usage: uv run python bench/shard.py [--tiny] [--tokens 32] [--requests 3] [--prompt-words 48]
  default model: the generator's BENCH_SPEC (95 M params, ~380 MB, written once to
  --models-dir); --tiny uses the 1.3 M-param test model (protocol overhead dominates).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.worker.engines.mlx_ranks import local_instance, run_group

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_models import BENCH_SPEC, TINY_SPEC, generate_tiny_model
from skulk.shared.types.tasks import TextGenerationParams

CONFIGS = [("Pipeline", 1), ("Pipeline", 2), ("Pipeline", 3), ("Tensor", 2)]
WORDS = ["the", "cluster", "by", "the", "sea", "holds", "a", "node", "that", "serves", "a", "model", "to", "everyone", "who", "asks"]


def model_dir(models_dir: Path, tiny: bool) -> tuple[Path, object]:
    spec = TINY_SPEC if tiny else BENCH_SPEC
    target = models_dir / ("tiny" if tiny else "bench")
    if not (target / "hf" / "config.json").is_file():
        print(f"writing the {'tiny' if tiny else 'bench'} model to {target} ...", flush=True)
        generate_tiny_model(target, spec)
    return target / "hf", spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "skulk-bench-models")
    parser.add_argument("--timeout", type=float, default=900.0, help="per configuration, seconds")
    args = parser.parse_args()

    path, spec = model_dir(args.models_dir, args.tiny)
    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml").model_copy(
        update={"num_layers": spec.num_layers, "hidden_size": spec.hidden_size}
    )
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(args.prompt_words))
    requests = [
        TextGenerationParams(model_id=card.model_id, prompt=f"{n} {prompt}", max_tokens=args.tokens, temperature=0)
        for n in range(args.requests + 1)  # the first one warms caches and is not counted
    ]
    rows = []
    baseline_tokens = None
    for sharding, world in CONFIGS:
        started = time.monotonic()
        reports = run_group(local_instance(card, world, sharding), card, path, requests, timeout_s=args.timeout)
        failed = [r for r in reports if not r.ok]
        if failed:
            print(f"{sharding} x{world}: FAILED\n{failed[0].error}", flush=True)
            continue
        lead = reports[0]
        tokens = lead.tokens[1:]
        if baseline_tokens is None:
            baseline_tokens = tokens
        equal = tokens == baseline_tokens
        decode_rates = [(len(t) - 1) / d for t, d in zip(tokens, lead.decode_s[1:], strict=True) if d > 0 and len(t) > 1]
        row = {
            "config": f"{sharding.lower()} x{world}",
            "tok_s": statistics.median(decode_rates),
            "ttft_ms": statistics.median(lead.ttft_s[1:]) * 1000,
            # Bytes cover every request (the uncounted first one too) and the followers' share
            # of warm-up (a few tokens), so they are divided by every token generated.
            "bytes_per_token": sum(r.bytes_sent for r in reports) / max(1, sum(len(t) for t in lead.tokens)),
            "equal": equal,
            "wall_s": time.monotonic() - started,
        }
        rows.append(row)
        print(f"{row['config']}: {row['tok_s']:.1f} tok/s, TTFT {row['ttft_ms']:.0f} ms, "
              f"{row['bytes_per_token'] / 1024:.1f} KiB sent/token, same tokens as 1 rank: {equal} "
              f"({row['wall_s']:.0f}s incl. start-up)", flush=True)

    if not rows:
        return 1
    base = rows[0]
    print()
    print(f"model: {'tiny' if args.tiny else 'bench'} ({spec.num_layers} layers, hidden {spec.hidden_size}); "
          f"{args.requests} requests x {args.tokens} tokens, ~{args.prompt_words}-word prompts")
    print(f"{'config':<14}{'tok/s':>8}{'x1':>7}{'TTFT ms':>10}{'x1':>7}{'KiB/token':>11}{'same':>6}")
    for row in rows:
        print(f"{row['config']:<14}{row['tok_s']:>8.1f}{row['tok_s'] / base['tok_s']:>7.2f}"
              f"{row['ttft_ms']:>10.0f}{row['ttft_ms'] / base['ttft_ms']:>7.2f}"
              f"{row['bytes_per_token'] / 1024:>11.1f}{'yes' if row['equal'] else 'NO':>6}")
    return 0 if all(row["equal"] for row in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
