"""Conversations that stay hot: interleaved multi-turn chats, Skulk against its peers.

C conversations (default 4) take turns, T turns each (default 8), round-robin (conversation
1 turn 1, conversation 2 turn 1, ...), every turn resending the whole history (system
prompt, every earlier user message and reply) plus a new user message, as chat clients and
coding agents do. TTFT (request sent -> first content delta, streaming chat completions
over loopback HTTP) is measured per turn. Printed per contender: p50 TTFT of turn 1, p50 of
turns 2..T, their ratio (the issue's target: <= 1.3 for Skulk), and Skulk's later-turn p50
against each peer's.

Contenders, all on the same generated GGUF and the same pinned llama.cpp:
  skulk         one `skulk run` node on loopback, the model placed (the in-process llama.cpp
                engine with its prefix cache: hot context + cold KV store in host RAM).
  llama-cpp-py  llama-cpp-python's own server (`python -m llama_cpp.server`), defaults
                (one context; it re-uses only the previous request's prefix).
  llama-server  the managed llama-server build with its default slots and prompt cache
                (`--ctx-size` C x the model's context, so every conversation fits a slot).

The contenders run one after another (each with the same conversations, its own replies
going into its own histories; greedy decoding), so a shared machine's drift falls between
them: the load average is printed before and after, and figures from a loaded box are noisy.

Usage (the llama_cpp.server extras are not project dependencies, hence --with):

  uv run --with sse-starlette --with starlette-context --with pydantic-settings \\
      python bench/sessions.py [--spec bench|tiny] [--convs 4] [--turns 8] [--tokens 8]

`--spec bench` (default) is the ~380 MB f32 generated Llama (tiny_models.BENCH_SPEC);
`--spec tiny` the 5 MB test model (where prefill is so cheap that TTFT is mostly overhead).
Every process started here is stopped on the way out; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve import (
    MODEL_ID,
    SERVER_START_DEADLINE_S,
    SPECS,
    STOP_DEADLINE_S,
    PeerServer,
    ensure_bench_model,
    peer_server_available,
    place_on_skulk,
    start_skulk,
    wait_answering,
)
from tests.cluster.harness import wait_agreed
from tests.llama_server_kit import find_llama_server
from tests.nodeproc import free_port

from skulk.worker.engines.llama_cpp.engine import physical_cores

SYSTEM = "You are a patient storyteller. Answer every question with a short story about the sea."
OPENERS = ["Tell me about a lighthouse keeper.", "Tell me about a fishing boat in a storm.",
           "Tell me about a whale that sings.", "Tell me about a harbour town at dawn.",
           "Tell me about a lost compass.", "Tell me about a ship in a bottle."]
FOLLOW_UP = "Continue the story, and add one more detail about the {n}th wave."
REQUEST_DEADLINE_S = 600.0


@dataclass
class Contender:
    name: str
    base_url: str
    model: str
    stop: Callable[[], None]
    ttft: dict[int, list[float]] = field(default_factory=dict)
    """turn -> TTFT seconds of every conversation's request at that turn."""
    cached: list[int] = field(default_factory=list)


def chat_stream(contender: Contender, messages: list[dict], max_tokens: int) -> tuple[float, str, int | None]:
    """(TTFT s, reply text, cached prompt tokens if reported) of one streamed chat completion."""
    body = {"model": contender.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    cached: int | None = None
    with httpx.stream("POST", contender.base_url + "/v1/chat/completions", json=body,
                      timeout=REQUEST_DEADLINE_S) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{contender.name}: {response.status_code} {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    parts.append(text)
            usage = event.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached = int(details["cached_tokens"])
    if first is None:
        first = time.perf_counter()
    return first - started, "".join(parts), cached


def run_conversations(contender: Contender, convs: int, turns: int, max_tokens: int) -> None:
    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(convs)]
    # One throwaway request first: page the weights in and build graphs outside the timing.
    chat_stream(contender, [{"role": "user", "content": "Hello"}], 2)
    for turn in range(1, turns + 1):
        for c in range(convs):
            user = OPENERS[c % len(OPENERS)] if turn == 1 else FOLLOW_UP.format(n=turn)
            histories[c].append({"role": "user", "content": user})
            ttft, reply, cached = chat_stream(contender, histories[c], max_tokens)
            histories[c].append({"role": "assistant", "content": reply})
            contender.ttft.setdefault(turn, []).append(ttft)
            if cached is not None and turn > 1:
                contender.cached.append(cached)
            print(f"  {contender.name:13} turn {turn} conv {c + 1}: TTFT {ttft * 1000:7.1f} ms"
                  + (f"  cached {cached}" if cached is not None else ""), flush=True)


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int, n_ctx: int, log_path: Path) -> Iterator[Contender]:
    port = free_port()
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                             "--ctx-size", str(n_ctx), "--threads", str(threads), "--jinja", "--no-webui",
                             "--alias", MODEL_ID], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(proc, lambda: httpx.get(url + "/health", timeout=5).status_code == 200,
                       SERVER_START_DEADLINE_S, "llama-server", lambda: log_path.read_text())
        yield Contender("llama-server", url, MODEL_ID, lambda: None)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_DEADLINE_S)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", choices=sorted(SPECS), default="bench")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--convs", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8, help="reply tokens per turn")
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--skip", action="append", default=[], choices=["skulk", "llama-cpp-py", "llama-server"])
    args = parser.parse_args()
    spec = SPECS[args.spec]
    gguf = ensure_bench_model(args.model_dir, spec)
    print(f"model      {gguf} ({gguf.stat().st_size / 1e6:.0f} MB, spec {args.spec})")
    print(f"workload   {args.convs} interleaved conversations x {args.turns} turns, {args.tokens} reply tokens, "
          f"greedy, threads {args.threads}")
    print(f"load avg   {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (before)")
    results: list[Contender] = []
    with tempfile.TemporaryDirectory(prefix="skulk-bench-sessions-") as tmp:
        root = Path(tmp)
        if "skulk" not in args.skip:
            node = start_skulk(root, gguf, flash_attn=False, spec=spec)
            try:
                node.wait_ready()
                wait_agreed([node], members=1, what="single-node cluster")
                place_on_skulk(node)
                skulk = Contender("skulk", node.url, MODEL_ID, node.stop)
                run_conversations(skulk, args.convs, args.turns, args.tokens)
                results.append(skulk)
            finally:
                node.stop()
        if "llama-cpp-py" not in args.skip:
            missing = peer_server_available()
            if missing is not None:
                print(f"llama-cpp-py skipped: {missing} (run with the --with extras in the usage line)")
            else:
                peer = PeerServer(gguf, args.threads, spec.context_length, False, root / "peer.log").start()
                try:
                    peer.wait_ready()
                    contender = Contender("llama-cpp-py", peer.url, MODEL_ID, peer.stop)
                    run_conversations(contender, args.convs, args.turns, args.tokens)
                    results.append(contender)
                finally:
                    peer.stop()
        if "llama-server" not in args.skip:
            binary = find_llama_server()
            if binary is None:
                print("llama-server skipped: no managed build (`uv run skulk engines install --backend cpu`)")
            else:
                with llama_server(binary, gguf, args.threads, spec.context_length * args.convs,
                                  root / "llama-server.log") as contender:
                    run_conversations(contender, args.convs, args.turns, args.tokens)
                    results.append(contender)
    print(f"load avg   {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (after)")
    print()
    print(f"{'contender':13} {'p50 TTFT turn 1':>16} {'p50 turns 2-' + str(args.turns):>16} {'later/turn1':>12}"
          f" {'cached (p50)':>13}")
    later: dict[str, float] = {}
    for contender in results:
        first = p50(contender.ttft.get(1, []))
        rest = p50([t for turn, values in contender.ttft.items() if turn > 1 for t in values])
        later[contender.name] = rest
        cached = f"{statistics.median(contender.cached):.0f}" if contender.cached else "-"
        print(f"{contender.name:13} {first * 1000:13.1f} ms {rest * 1000:13.1f} ms {rest / first:12.2f} {cached:>13}")
    if "skulk" in later:
        for name, value in later.items():
            if name != "skulk":
                print(f"skulk / {name:13} later-turn p50 TTFT: {later['skulk'] / value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
