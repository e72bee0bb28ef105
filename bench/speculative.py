"""Speculative decoding on the llama.cpp engine a node serves GGUF with (llama-server):
decode tokens per second with and without drafting, side by side in one run.

Rows, each a llama-server started with Skulk's own launch line (`ServerLaunch`) on the
benchmark-sized generated model (95 M parameters, ~380 MB of f32: a decoded token streams
enough memory that the timings measure the model, not per-token overhead):

  none       no drafting: the baseline
  ngram      `runtime.speculative = "ngram"`: llama-server's n-gram drafting from the context
  draft      `runtime.speculative = "draft"`: a draft model of the same tokenizer (the generated
             1.3 M-parameter tiny model) as the card's draft companion (`--model-draft`)

Two workloads, greedy: `edit`, a prompt holding a block of code to rewrite, and `repeat`, a
prompt of repeated boilerplate (the context then holds many n-grams the output can hit). The
random model never copies its prompt on purpose, so these ratios are an honest floor, not the
gain on a real model editing real code, whose output copies long spans of its prompt. Each row's decode rate is llama-server's own `predicted_per_second`
(decode only), median of --reps interleaved requests; the greedy text of every drafting row
must equal the baseline's (printed). Run it on a quiet machine: the load average is printed.

Usage: uv run python bench/speculative.py [--tokens 256] [--reps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llama_server_kit import find_llama_server

from skulk.models.tiny_models import BENCH_SPEC, TINY_SPEC, generate_tiny_model
from skulk.shared.types.speculative import LLAMA_SERVER_SPEC_TYPES
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
    out = Path(tempfile.gettempdir()) / "skulk-bench-models" / name
    gguf = out / "model.gguf"
    return gguf if gguf.is_file() else generate_tiny_model(out, spec).gguf_path


def start(binary: Path, gguf: Path, threads: int, spec_type: str | None, draft: Path | None) -> ServerProcess:
    port = free_loopback_port()
    argv = ServerLaunch(binary, gguf, port, 1, 4096, threads, 0, True, spec_type=spec_type, draft_model_path=draft).argv()
    server = ServerProcess(argv, server_env(os.environ), port)
    server.wait_healthy()
    return server


BOILERPLATE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 8
WORKLOADS = {"edit": PROMPT, "repeat": BOILERPLATE}


def decode(server: ServerProcess, prompt: str, tokens: int) -> tuple[float, str, int, int]:
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "stream": False, "cache_prompt": False}
    answer = httpx.post(f"{server.base_url}/completion", json=body, timeout=600).json()
    timings = answer["timings"]
    return (float(timings["predicted_per_second"]), answer["content"], int(timings.get("draft_n") or 0),
            int(timings.get("draft_n_accepted") or 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    binary = find_llama_server()
    if binary is None:
        raise SystemExit("no llama-server: run `uv run skulk engines install --backend cpu`")
    target, drafter = model(BENCH_SPEC, "bench"), model(TINY_SPEC, "tiny")
    rows = {"none": (None, None), "ngram": (LLAMA_SERVER_SPEC_TYPES["ngram"], None), "draft": (LLAMA_SERVER_SPEC_TYPES["draft"], drafter)}
    servers = {name: start(binary, target, args.threads, spec, draft) for name, (spec, draft) in rows.items()}
    print(f"llama-server {binary}; target {target.stat().st_size / 1e6:.0f} MB, draft {drafter.stat().st_size / 1e6:.1f} MB; "
          f"{args.tokens} tokens x {args.reps} reps; load average {os.getloadavg()}")
    same = True
    try:
        for workload, prompt in WORKLOADS.items():
            rates: dict[str, list[float]] = {name: [] for name in rows}
            texts: dict[str, str] = {}
            drafted: dict[str, tuple[int, int]] = {}
            for _ in range(args.reps):
                for name, server in servers.items():  # interleaved: a neighbour's burst hits every row alike
                    rate, text, n_draft, n_accepted = decode(server, prompt, args.tokens)
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
    finally:
        for server in servers.values():
            server.stop()
    print(f"\nload average after: {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
