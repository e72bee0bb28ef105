"""Concurrency benchmark: many requests at once, side by side in one run, on one GGUF.

Contenders, all loaded together and measured in rotating order per round (so a shared
machine's drift falls on all alike):

  direct     the llama-server binary, started here with the same command line Skulk's
             engine uses (skulk.worker.engines.served.launch.ServerLaunch, --parallel 8),
             driven with streaming /completion requests from C client processes.
  served     Skulk's `llama_server` engine in a real runner subprocess (RunnerSupervisor:
             runner IPC, dispatcher at the slot width, the engine's HTTP client inside the
             runner), C tasks submitted at once.
  bundled    the same `llama_server` engine and runner, serving with the bundled
             `skulk-llama-server` (llama.cpp's server from the xllamacpp wheel): what a
             fresh node with nothing built serves with.
  inproc     Skulk's in-process `llama_cpp` engine in a real runner subprocess (width 1:
             the C tasks queue behind each other).

Each contender decodes N tokens per request (greedy, a prompt the model never ends early)
for C in 1, 4 and 8 concurrent requests. Printed per (contender, C): aggregate decode tok/s
(all completion tokens over the wall time from the first submit to the last finish), and
p50/p95 time to first token (medians over rounds); then per C the ratio of each round's
served run to the same round's direct and in-process runs, as the median over rounds and
its range (targets: served/direct >= 1.0, bundled/direct >= 0.8 at C=4). Contenders run one after another, never
together, each round in a rotated order (direct, served, inproc; then served, inproc,
direct; ...), so a round's ratios compare runs seconds apart under the same load; the
range shows what noise remains. The load average is printed before and after each C:
on a shared box the absolute figures move, the per-round ratios much less.

On a box so loaded that even the wall-clock ratios swing (other processes take most of the
cores), the CPU table is the figure to read: CPU microseconds per generated token, median
over rounds, split into the server (llama-server, or the in-process engine's runner) and
the client side (direct: the client processes; served: the runner's engine, IPC and the
supervisor's reader in this process). When decode is CPU-bound, served/direct aggregate
throughput tends to direct CPU per token / served CPU per token whatever the load.

`--bench-model` serves bench/serve.py's generated ~380 MB f32 GGUF (8 layers x 1024 hidden;
generated on first use, ~10 s) instead of the 5 MB test model: decode is then bound by
memory bandwidth, as with a real model, and per-token overheads weigh far less.

Usage: uv run python bench/concurrency.py [--tokens 128] [--rounds 5] [--threads 2] [--no-inproc]
                                          [--no-bundled] [--gguf PATH | --bench-model]
The figure for the issue's target (served vs direct only, about 7 minutes on a quiet
2-core box): `uv run python bench/concurrency.py --bench-model --no-inproc`.
Each round's figures are printed as it ends, the tables at the end.
On a box with more runnable threads than cores (a shared one), `--threads 1` keeps
llama.cpp's spinning thread barriers, which stall whenever one of their threads is
descheduled, from dominating every contender's figures.
Needs a native llama-server (`skulk engines install --backend cpu`, or SKULK_LLAMA_SERVER_BIN);
the bundled contender needs xllamacpp (installed with Skulk on x86_64 Linux and macOS).
Every process started here is stopped on the way out; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llama_server_kit import find_native_llama_server
from tests.worker.tiny_gguf import LONG_PROMPT, RUNNER, prompt_params, text_task, tiny_instance

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.provision.node_engine import find_bundled_server
from skulk.worker.engines.served.launch import ServerLaunch, completion_body, server_env
from skulk.worker.engines.served.process import ServerProcess, free_loopback_port
from skulk.worker.runner.messages import Frame, StatusChanged, TaskDone
from skulk.worker.runner.supervisor import RunnerSupervisor

CONCURRENCY = (1, 4, 8)
SLOTS = 8
CONTEXT_PER_SLOT = 1024
READY_DEADLINE_S = 180.0
RUN_DEADLINE_S = 600.0
WARM_UP_TOKENS = 16


class Measure:
    """TTFTs and token counts of one batch of concurrent requests."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.first: dict[str, float] = {}
        self.tokens = 0
        self.ended = self.started
        self.lock = threading.Lock()

    def token(self, request: str, count: int = 1) -> None:
        now = time.monotonic()
        with self.lock:
            self.first.setdefault(request, now - self.started)
            self.tokens += count
            self.ended = now

    def result(self) -> tuple[float, float, float]:
        ttfts = sorted(self.first.values())
        p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
        return self.tokens / (self.ended - self.started), statistics.median(ttfts), p95


_CLIENT: httpx.Client | None = None


def _client_process_init() -> None:
    """One HTTP client per pool process, made before measuring (building an httpx client
    costs milliseconds of CPU: an SSL context), as the runner holds one for its engine."""
    global _CLIENT
    _CLIENT = httpx.Client(timeout=RUN_DEADLINE_S)


def _direct_stream(base_url: str, tokens: int) -> tuple[float | None, float, int]:
    """One streaming /completion in a pool process: (first token, last token, tokens), on
    the machine-wide monotonic clock. A process per stream, so the client's SSE parsing is
    never the bottleneck (the runner parses in its own process too)."""
    # The very body Skulk's engine sends for the same request: only the path differs.
    body = completion_body(prompt_params(LONG_PROMPT, temperature=0, max_tokens=tokens), LONG_PROMPT, None)
    first, last, count = None, time.monotonic(), 0
    assert _CLIENT is not None
    with _CLIENT.stream("POST", f"{base_url}/completion", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("content"):
                    last = time.monotonic()
                    first = first or last
                    count += len(event.get("tokens") or [1])
    return first, last, count


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def run_direct(pool: ProcessPoolExecutor, base_url: str, concurrency: int, tokens: int) -> Measure:
    measure = Measure()
    futures = [pool.submit(_direct_stream, base_url, tokens) for _ in range(concurrency)]
    for index, future in enumerate(futures):
        first, last, count = future.result(RUN_DEADLINE_S)
        measure.first[f"d{index}"] = (first or last) - measure.started
        measure.tokens += count
        measure.ended = max(measure.ended, last)
    return measure


class Runner:
    """One supervised runner on its own event loop thread."""

    def __init__(self, backend: str, card, gguf: Path, threads: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.states: list[str] = []
        self.measure: Measure | None = None
        self.done: set[str] = set()
        self.done_event = threading.Event()
        self.expected = 0

        def report(message) -> None:
            if isinstance(message, StatusChanged):
                self.states.append(message.status.state)
            elif isinstance(message, Frame) and self.measure is not None:
                chunk = getattr(message.frame, "chunk", None)
                if chunk is not None and getattr(chunk, "text", ""):
                    self.measure.token(str(message.frame.command_id))
            elif isinstance(message, TaskDone):
                self.done.add(message.task_id)
                if len(self.done) >= self.expected:
                    self.done_event.set()

        self.supervisor = RunnerSupervisor(
            # The slot count is a placement fact: stamped on the shard as the master would.
            instance=tiny_instance(card, context_token_limit=CONTEXT_PER_SLOT, backend=backend,
                                   slots=SLOTS if backend.startswith("llama_server") else 1),
            runner_id=RUNNER, card=card, model_path=str(gguf), on_report=report, n_threads=threads,
        )
        self.call(self.supervisor.start())
        deadline = time.monotonic() + READY_DEADLINE_S
        while not self.states or self.states[-1] not in ("Ready", "Failed"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{backend} runner not ready: {self.states}")
            time.sleep(0.1)
        if self.states[-1] != "Ready":
            raise RuntimeError(f"{backend} runner failed to load")

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(READY_DEADLINE_S)

    def run(self, concurrency: int, tokens: int, tag: str) -> Measure:
        self.measure = Measure()
        self.done, self.expected = set(), concurrency
        self.done_event.clear()
        tasks = [text_task(f"{tag}-{i}", prompt_params(LONG_PROMPT, temperature=0, max_tokens=tokens))
                 for i in range(concurrency)]
        for task in tasks:
            self.loop.call_soon_threadsafe(self.supervisor.submit, task)
        if not self.done_event.wait(RUN_DEADLINE_S):
            raise TimeoutError(f"{tag}: not done")
        return self.measure

    def close(self) -> None:
        try:
            self.call(self.supervisor.shutdown(timeout_s=10.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


def _bench_model():
    """bench/serve.py's generated GGUF and a card of its shape."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve import card_toml, ensure_bench_model

    gguf = ensure_bench_model(None)
    cards = Path(tempfile.mkdtemp(prefix="skulk-bench-card-"))
    path = cards / "local--bench-llama-gguf.toml"
    path.write_text(card_toml(gguf, flash_attn=True))
    return load_card(path), gguf


def spread(values: list[float]) -> str:
    """Median and range of per-round values: 'median (min..max)'."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"


def report(
    names: list[str],
    results: dict[tuple[str, int], list[tuple[float, float, float]]],
    cpu: dict[tuple[str, int], list[tuple[float, float]]],
    loads: dict[int, tuple[tuple[float, float, float], tuple[float, float, float]]],
    rounds: int,
) -> None:
    """The tables: per (contender, C) the medians over rounds; then per C the ratio of each
    round's served run to the same round's direct (and in-process) run, median and range:
    a round's runs are adjacent in time, so its ratio is what a shared machine's drift
    disturbs least, and the range says how far to trust the median."""
    print(f"{'contender':<8} {'C':>2} {'agg tok/s':>10} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12}")
    for (name, c), rows in sorted(results.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0]))):
        agg = statistics.median(row[0] for row in rows)
        p50 = statistics.median(row[1] for row in rows) * 1000
        p95 = statistics.median(row[2] for row in rows) * 1000
        print(f"{name:<8} {c:>2} {agg:>10.1f} {p50:>12.1f} {p95:>12.1f}")
    print(f"per-round aggregate ratios over {rounds} rounds, median (min..max):")
    for c in CONCURRENCY:
        served = [row[0] for row in results[("served", c)]]
        line = f"C={c}: served/direct = {spread([s / d[0] for s, d in zip(served, results[('direct', c)], strict=True)])}"
        line += " (target >= 1.0)"
        if ("bundled", c) in results:
            bundled = [b[0] / d[0] for b, d in zip(results[("bundled", c)], results[("direct", c)], strict=True)]
            line += f", bundled/direct = {spread(bundled)} (target >= 0.8 at C=4)"
        if ("inproc", c) in results:
            inproc = [s / i[0] for s, i in zip(served, results[("inproc", c)], strict=True)]
            line += f", served/inproc = {spread(inproc)}"
        before, after = loads[c]
        line += f"; load {before[0]:.2f} -> {after[0]:.2f}"
        print(line)
    print(f"{'contender':<8} {'C':>2} {'server us/tok':>14} {'client us/tok':>14} {'total us/tok':>13}")
    total: dict[tuple[str, int], list[float]] = {}
    for (name, c), rows in sorted(cpu.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0]))):
        server_us = statistics.median(row[0] for row in rows)
        client_us = statistics.median(row[1] for row in rows)
        total[(name, c)] = [row[0] + row[1] for row in rows]
        print(f"{name:<8} {c:>2} {server_us:>14.0f} {client_us:>14.0f} {statistics.median(total[(name, c)]):>13.0f}")
    for c in CONCURRENCY:
        ratios = [d / s for d, s in zip(total[("direct", c)], total[("served", c)], strict=True)]
        print(f"C={c}: CPU per token direct/served = {spread(ratios)} "
              "(the CPU-bound throughput ratio served/direct)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", type=Path, default=None,
                        help="a GGUF to serve instead of the tiny test model (the tiny card's shape is assumed)")
    parser.add_argument("--no-inproc", action="store_true",
                        help="leave the in-process engine out (it queues: the slowest contender at C=8)")
    parser.add_argument("--no-bundled", action="store_true",
                        help="leave the bundled llama-server (xllamacpp) out")
    parser.add_argument("--bench-model", action="store_true",
                        help="serve bench/serve.py's generated ~380 MB GGUF with its own card")
    args = parser.parse_args()
    binary = find_native_llama_server()
    bundled_server = None if args.no_bundled else find_bundled_server()
    if binary is None:
        print("no llama-server: run `uv run skulk engines install --backend cpu`", file=sys.stderr)
        return 2
    card = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    if args.bench_model:
        card, gguf = _bench_model()
    else:
        gguf = args.gguf or Path(ensure_local_model(card, Path(tempfile.gettempdir()) / "skulk-bench-models"))
    os.environ["SKULK_LLAMA_SERVER_BIN"] = str(binary)
    print(f"model {gguf} ({gguf.stat().st_size / 1e6:.1f} MB), {args.tokens} tokens/request, "
          f"{args.threads} threads, {SLOTS} slots, binary {binary}")
    print(f"load average before: {os.getloadavg()}")

    port = free_loopback_port()
    launch = ServerLaunch(binary, gguf, port, SLOTS, CONTEXT_PER_SLOT, args.threads, 0, True)
    direct = ServerProcess(launch.argv(), server_env(os.environ), port)
    runners: list[Runner] = []
    pool = ProcessPoolExecutor(max_workers=max(CONCURRENCY), initializer=_client_process_init)
    try:
        direct.wait_healthy()
        list(pool.map(abs, range(max(CONCURRENCY))))  # start the client processes before measuring
        served = Runner("llama_server-cpu", card, gguf, args.threads)
        runners.append(served)
        bundled = None
        if bundled_server is not None:
            os.environ["SKULK_LLAMA_SERVER_BIN"] = str(bundled_server.path)  # the runner inherits it at start
            try:
                bundled = Runner("llama_server-cpu", card, gguf, args.threads)
            finally:
                os.environ["SKULK_LLAMA_SERVER_BIN"] = str(binary)
            runners.append(bundled)
        inproc = None if args.no_inproc else Runner("llama_cpp-cpu", card, gguf, args.threads)
        if inproc is not None:
            runners.append(inproc)
        contenders: dict[str, Callable[[int, str, int], Measure]] = {
            "direct": lambda c, tag, n: run_direct(pool, direct.base_url, c, n),
            "served": lambda c, tag, n: served.run(c, n, tag),
        }
        served_pid = served.supervisor.pid
        assert served_pid is not None
        runner_pids = {served_pid}
        served_server = [p.pid for p in psutil.Process(served_pid).children(recursive=True)]
        # (server side, client side) processes per contender; this process is the served
        # runner's supervisor (its pipe reader), and idles while the others run.
        sides: dict[str, tuple[list[int], list[int]]] = {"served": (served_server, [served_pid, os.getpid()])}
        if bundled is not None:
            bundled_pid = bundled.supervisor.pid
            assert bundled_pid is not None
            contenders["bundled"] = lambda c, tag, n: bundled.run(c, n, tag)
            sides["bundled"] = ([p.pid for p in psutil.Process(bundled_pid).children(recursive=True)],
                                [bundled_pid, os.getpid()])
            runner_pids.add(bundled_pid)
        if inproc is not None:
            assert inproc.supervisor.pid is not None
            contenders["inproc"] = lambda c, tag, n: inproc.run(c, n, tag)
            sides["inproc"] = ([inproc.supervisor.pid], [])
            runner_pids.add(inproc.supervisor.pid)
        sides["direct"] = ([direct.pid], [p.pid for p in psutil.Process().children()
                                          if p.pid != direct.pid and p.pid not in runner_pids])
        names = list(contenders)
        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        cpu: dict[tuple[str, int], list[tuple[float, float]]] = {}
        loads: dict[int, tuple[tuple[float, float, float], tuple[float, float, float]]] = {}
        for name, run in contenders.items():
            # Unmeasured: a server's first batch pays one-off costs (buffers, the prompt
            # cache filling), which landed on whichever contender happened to go first.
            run(max(CONCURRENCY), f"{name}-warm", WARM_UP_TOKENS)
        for c in CONCURRENCY:
            load_before = os.getloadavg()
            for r in range(args.rounds):
                # Rotating order: every contender runs once per round, each next to the
                # others, so a round's ratios compare runs under the same load.
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    server_pids, client_pids = sides[name]
                    before = cpu_s(server_pids), cpu_s(client_pids)
                    measure = contenders[name](c, f"{name}-{c}-{r}", args.tokens)
                    after = cpu_s(server_pids), cpu_s(client_pids)
                    results.setdefault((name, c), []).append(measure.result())
                    per_token = max(measure.tokens, 1) / 1e6
                    cpu.setdefault((name, c), []).append(
                        ((after[0] - before[0]) / per_token, (after[1] - before[1]) / per_token))
                line = ", ".join(f"{name} {results[(name, c)][-1][0]:.1f}" for name in names)
                ratio = results[("served", c)][-1][0] / results[("direct", c)][-1][0]
                print(f"C={c} round {r + 1}/{args.rounds}: {line} tok/s; served/direct {ratio:.2f}; "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
            loads[c] = (load_before, os.getloadavg())
        print(f"load average after: {os.getloadavg()}")
        report(names, results, cpu, loads, args.rounds)
    finally:
        pool.shutdown(cancel_futures=True)
        for runner in runners:
            runner.close()
        direct.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
