"""Chat prompt tokenization on the tiny GGUF: the old whole-text special-token parse against
the engine's linear one (`worker/engines/prompt_pieces.py`), side by side in one run. The
new time includes its two renders of the chat template; the old one excludes its render.

The old way parsed special tokens over the whole rendered chat, which is quadratic in the
number of special-token fragments; the engine now searches only the template's own text and
tokenizes caller text plainly. Prints seconds and the old/new ratio per conversation size.

Usage:
  uv run python bench/prompt_tokenization.py [--messages 1000,2000,4000,8000]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

UNBOUNDED_CONTEXT = 10**9
"""Measure the full tokenization, not the engine's stop at the context."""


def load(models_dir: Path) -> LlamaCppEngine:
    card = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    path = ensure_local_model(card, models_dir)
    shard = ShardAssignment(node_id="bench", runner_id="r0", rank=0, world_size=1, start_layer=0,
                            end_layer=card.num_layers, backend="llama_cpp-cpu")
    instance = Instance(instance_id="i0", model_id=card.model_id, sharding="Pipeline", shards=[shard],
                        context_token_limit=2048)
    engine = LlamaCppEngine()
    engine.load(ShardSpec(instance=instance, runner_id="r0", card=card, model_path=str(path), n_threads=1))
    return engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", default="1000,2000,4000,8000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as models:
        engine = load(Path(models))
        engine._n_ctx = UNBOUNDED_CONTEXT
        print(f"{'messages':>8} {'chars':>9} {'old s':>8} {'new s':>8} {'old/new':>8}")
        for count in (int(n) for n in args.messages.split(",")):
            messages = [ChatMessage(role="user" if i % 2 == 0 else "assistant", content=f"hello {i} <|eot_id|>")
                        for i in range(count)]
            params = TextGenerationParams(model_id="local/tiny-llama-gguf", messages=messages)
            text = engine.render_chat(params)
            start = time.perf_counter()
            engine.llama.tokenize(text.encode(), add_bos=False, special=True)
            old = time.perf_counter() - start
            start = time.perf_counter()
            engine.prompt_tokens(params, threading.Event())
            new = time.perf_counter() - start
            print(f"{count:>8} {len(text):>9} {old:>8.2f} {new:>8.2f} {old / new:>8.1f}")
        engine.close()


if __name__ == "__main__":
    main()
