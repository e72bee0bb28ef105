"""Speculative decoding on the engines that draft (llama-server for GGUF, MLX for
safetensors): decode tokens per second with and without drafting, side by side in one run.

Rows per engine, on the benchmark-sized generated model (95 M parameters, ~380 MB of f32: a
decoded token streams enough memory that the timings measure the model, not per-token
overhead):

  none       no drafting: the baseline
  ngram      `runtime.speculative = "ngram"`: drafting from n-grams of the context
  draft      `runtime.speculative = "draft"`: a draft model of the same tokenizer (the generated
             1.3 M-parameter tiny model) as the card's draft companion

llama-server rows: servers started with Skulk's own launch line (`ServerLaunch`, the draft as
`--model-draft`); the decode rate is llama-server's own `predicted_per_second`. MLX rows: the
real `MlxEngine` on one rank (the draft from the tiny model's safetensors folder); the decode
rate is the tokens after the first over the time from the first token to the last (prefill
excluded, as llama-server's is). On Linux MLX runs on its CPU backend: an honest CPU figure,
not a Metal one.

Two workloads, greedy: `edit`, a prompt holding a block of code to rewrite, and `repeat`, a
prompt of repeated boilerplate (the context then holds many n-grams the output can hit). The
random model never copies its prompt on purpose, so these ratios are an honest floor, not the
gain on a real model editing real code, whose output copies long spans of its prompt. Each row's decode rate is llama-server's own `predicted_per_second`
(decode only), median of --reps interleaved requests; the greedy text of every drafting row
must equal the baseline's (printed). Run it on a quiet machine: the load average is printed.

Usage: uv run python bench/speculative.py [--tokens 256] [--reps 5] [--threads 2]
                                          [--engine all|llama_server|mlx]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llama_server_kit import find_llama_server
from tests.worker.engines.mlx_ranks import local_instance

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_models import BENCH_SPEC, TINY_SPEC, generate_tiny_model
from skulk.shared.types.ids import ModelId
from skulk.shared.types.speculative import LLAMA_SERVER_SPEC_TYPES
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import ShardSpec
from skulk.worker.engines.mlx.engine import MlxEngine
from skulk.worker.engines.served.launch import ServerLaunch, server_env
from skulk.worker.engines.served.process import ServerProcess, free_loopback_port

CODE = '''def parse_header(line):
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()


def parse_headers(lines):
    headers = {}
    for line in lines:
        name, value = parse_header(line)
        headers[name] = value
    return headers
'''
PROMPT = f"Rename parse_header to split_header everywhere in this code and return the whole file:\n\n{CODE}\n"


def model(spec, name: str) -> Path:
    """The generated model's directory (its GGUF `model.gguf`, its safetensors folder `hf/`)."""
    out = Path(tempfile.gettempdir()) / "skulk-bench-models" / name
    if not (out / "model.gguf").is_file():
        generate_tiny_model(out, spec)
    return out


def start(binary: Path, gguf: Path, threads: int, spec_type: str | None, draft: Path | None) -> ServerProcess:
    port = free_loopback_port()
    argv = ServerLaunch(binary, gguf, port, 1, 4096, threads, 0, True, spec_type=spec_type, draft_model_path=draft).argv()
    server = ServerProcess(argv, server_env(os.environ), port)
    server.wait_healthy()
    return server


BOILERPLATE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 8
WORKLOADS = {"edit": PROMPT, "repeat": BOILERPLATE}


Decode = Callable[[str, int], tuple[float, str, int, int]]
"""(prompt, tokens) -> (decode tok/s, the greedy output, drafted, accepted)."""


def decode(server: ServerProcess, prompt: str, tokens: int) -> tuple[float, str, int, int]:
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "stream": False, "cache_prompt": False}
    answer = httpx.post(f"{server.base_url}/completion", json=body, timeout=600).json()
    timings = answer["timings"]
    return (float(timings["predicted_per_second"]), answer["content"], int(timings.get("draft_n") or 0),
            int(timings.get("draft_n_accepted") or 0))


def compare(rows: Mapping[str, Decode], reps: int, tokens: int) -> bool:
    """Print each workload's table; whether every drafting row's text equals the baseline's."""
    same = True
    for workload, prompt in WORKLOADS.items():
        rates: dict[str, list[float]] = {name: [] for name in rows}
        texts: dict[str, str] = {}
        drafted: dict[str, tuple[int, int]] = {}
        for _ in range(reps):
            for name, run in rows.items():  # interleaved: a neighbour's burst hits every row alike
                rate, text, n_draft, n_accepted = run(prompt, tokens)
                rates[name].append(rate)
                texts[name], drafted[name] = text, (n_draft, n_accepted)
        base = statistics.median(rates["none"])
        print(f"\n{workload}: {'row':<6} {'tok/s':>8} {'ratio':>7} {'drafted':>8} {'accepted':>9} {'rate':>6}  same text")
        for name in rows:
            rate = statistics.median(rates[name])
            n_draft, n_accepted = drafted[name]
            acceptance = f"{n_accepted / n_draft:.0%}" if n_draft else "-"
            print(f"{'':<{len(workload) + 2}}{name:<6} {rate:8.1f} {rate / base:6.2f}x {n_draft:8d} {n_accepted:9d} "
                  f"{acceptance:>6}  {texts[name] == texts['none']}")
            same = same and texts[name] == texts["none"]
    return same


def llama_server_rows(args: argparse.Namespace, target: Path, drafter: Path) -> bool:
    binary = find_llama_server()
    if binary is None:
        print("\nllama-server: skipped (no llama-server: run `uv run skulk engines install --backend cpu`)")
        return True
    target_gguf, draft_gguf = target / "model.gguf", drafter / "model.gguf"
    rows = {"none": (None, None), "ngram": (LLAMA_SERVER_SPEC_TYPES["ngram"], None),
            "draft": (LLAMA_SERVER_SPEC_TYPES["draft"], draft_gguf)}
    servers = {name: start(binary, target_gguf, args.threads, spec, draft) for name, (spec, draft) in rows.items()}
    print(f"\nllama-server {binary}; target {target_gguf.stat().st_size / 1e6:.0f} MB, draft "
          f"{draft_gguf.stat().st_size / 1e6:.1f} MB; {args.tokens} tokens x {args.reps} reps; "
          f"load average {os.getloadavg()}")
    try:
        return compare({name: (lambda p, n, s=server: decode(s, p, n)) for name, server in servers.items()},
                       args.reps, args.tokens)
    finally:
        for server in servers.values():
            server.stop()


MLX_MODEL = ModelId("local/tiny-llama")
"""The tiny card the MLX rows borrow (reshaped to the benchmark model)."""


def mlx_engine(method: str, target: Path, drafter: Path) -> MlxEngine:
    """The MLX engine on the benchmark model, speculating with `method`."""
    tiny = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    card = tiny.model_copy(update={"num_layers": BENCH_SPEC.num_layers, "hidden_size": BENCH_SPEC.hidden_size,
                                   "runtime": tiny.runtime.model_copy(update={"speculative": method})})
    instance = local_instance(card, 1)
    engine = MlxEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                          model_path=str(target / "hf"), draft_model_path=str(drafter / "hf")))
    engine.warm_up()
    return engine


def mlx_decode(engine: MlxEngine, prompt: str, tokens: int) -> tuple[float, str, int, int]:
    request = TextGenerationParams(model_id=MLX_MODEL, prompt=prompt, max_tokens=tokens, temperature=0.0)
    stamps: list[float] = []
    ids: list[int] = []
    drafted = accepted = 0
    for token in engine.generate(request, threading.Event()):
        if token.token_id is not None:
            stamps.append(time.perf_counter())
            ids.append(token.token_id)
        if token.usage is not None:
            drafted, accepted = token.usage.drafted_tokens, token.usage.accepted_draft_tokens
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return rate, " ".join(map(str, ids)), drafted, accepted


def mlx_rows(args: argparse.Namespace, target: Path, drafter: Path) -> bool:
    engines = {method: mlx_engine(method, target, drafter) for method in ("none", "ngram", "draft")}
    print(f"\nMLX (the engine in process, one rank); {args.tokens} tokens x {args.reps} reps; "
          f"load average {os.getloadavg()}")
    try:
        return compare({name: (lambda p, n, e=engine: mlx_decode(e, p, n)) for name, engine in engines.items()},
                       args.reps, args.tokens)
    finally:
        for engine in engines.values():
            engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", choices=("all", "llama_server", "mlx"), default="all")
    args = parser.parse_args()
    target, drafter = model(BENCH_SPEC, "bench"), model(TINY_SPEC, "tiny")
    same = True
    if args.engine in ("all", "llama_server"):
        same = llama_server_rows(args, target, drafter) and same
    if args.engine in ("all", "mlx"):
        same = mlx_rows(args, target, drafter) and same
    print(f"\nload average after: {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
