"""Serving benchmark: Skulk's streaming chat path against the engine it wraps, a peer server
and the machine's memory roofline, measured side by side in one run.

One generated GGUF (BENCH_SPEC, ~380 MB of f32 weights; `--spec tiny` for the 5 MB test model,
where per-token serving overhead dominates), one thread count T, one sampling
setup (greedy: temperature 0, top_p 0.95, top_k 40, min_p 0.05, repeat_penalty 1.0, as
Skulk's engine passes them), the same chat prompts rendered by the model's own chat
template, N decoded tokens per request (the model never emits EOS, so every request runs to
N). Printed, as medians over the repetitions:

  (a) engine    llama_cpp.Llama in this process, `Llama.generate` on the tokenized prompt:
                no HTTP, no chat layer. TTFT = tokenize + prompt eval + first sample.
  (b) peer      llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`), driven
                with streaming chat completions over loopback HTTP.
  (c) skulk     one real `skulk run` node on loopback, the model registered by a custom
                card, placed with POST /place_instance, streamed through /v1/chat/completions.
  (d) roofline  this machine's read bandwidth with T processes (numpy max-reduce over private
                arrays; a lower bound on what the hardware can stream) divided by the bytes
                of weights read per decoded token: the most tokens/s any engine could get.

  (c') skulk-tr the same node with cluster-wide tracing on for its requests (--tracing; switched
                on before and off after each of them, outside the timing), so the ratio
                skulk-tr/skulk is tracing's cost side by side. The run also prints what
                tracing costs when off (the per-request flag read and the per-token test) and
                the span bookkeeping per traced token, both measured in-process in ns and
                put against the measured time of a token.

For (b) and (c) TTFT is request sent -> first content delta received, and decode tok/s
counts the tokens after the first over the time from the first to the last delta; (a) uses
the same definitions on the tokens `Llama.generate` yields. Ratios: skulk/engine (decode
and TTFT), skulk/peer, engine/roofline.

The contenders stay loaded together and the repetitions are interleaved in rotating order
(round r starts with contender r mod 3), so drift in a shared machine's load falls on all
three alike. Beside each figure the run prints the CPU per token of the measured contender
(its processes and this client), and the CPU that processes outside the benchmark used
meanwhile ("foreign", in cores) and the hypervisor's steal: a noisy neighbour shows up
there, not as a silent error. A measurement that a neighbour disturbed is repeated while
the quiet budget lasts (see QUIET_FOREIGN_CORES).

OpenMP barrier waiting (the figure that matters most on a busy machine). This llama.cpp
build runs its T threads under libgomp, which spins at every barrier (hundreds per token)
for ~300k iterations before sleeping. The engine here and the peer run as shipped and spin
that long; when a neighbour takes a core, the spinning starves the thread holding the work
and decode collapses (measured on 2 cores beside busy neighbours: 35-40 -> 2-8 tok/s at 3-8x
the CPU per token). Skulk's runner warms up and decodes on one thread (one team) and, unless
the operator set OMP_WAIT_POLICY or GOMP_SPINCOUNT, bounds the spin at
skulk.worker.engines.openmp.DEFAULT_SPIN_COUNT iterations: near the spinning engine on a
quiet machine, and it degrades gently beside neighbours (17 tok/s where the engine fell to
7.5 and the peer to 2). --omp-wait-policy passive sets OMP_WAIT_POLICY=PASSIVE for all three
(in this process before llama.cpp loads, and in the environment of the peer and the node):
the same footing, the serving path the only difference. The default measures each as shipped.

Thread count: Skulk's worker has no thread setting; its runner gives llama.cpp
`physical_cores()` threads (skulk.worker.engines.llama_cpp.engine). T defaults to that same
number; another --threads applies to (a), (b) and (d) only, and the run says so.

The model is generated once into --model-dir (default ~/.cache/skulk-bench/<spec hash>) and
reused. Every process started here is stopped on the way out, whatever happens; every wait
has a deadline.

Usage (the server extras are not project dependencies, hence --with):

  uv run --with sse-starlette --with starlette-context --with pydantic-settings \\
      python bench/serve.py [--tokens 128] [--reps 5] [--threads T] [--flash-attn on|off]
                            [--omp-wait-policy asis|passive] [--quiet-budget 120] [--spec bench|tiny]
                            [--tracing] [--skip-peer]

Without those packages (plain `uv run python bench/serve.py`) the peer (b) is skipped and
the run says why. On a quiet 2-core machine a default run takes about 2 minutes; under a
neighbour's constant load, where the engine and peer fall to ~3 tok/s, about 8.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.harness import wait_agreed
from tests.nodeproc import NodeProcess, free_port

from skulk.api.auth import API_KEY_ENV
from skulk.models.tiny_models import (
    BENCH_SPEC,
    GGUF_FILE_NAME,
    TINY_SPEC,
    TinySpec,
    generate_tiny_model,
    spec_hash,
)
from skulk.worker.engines.llama_cpp.engine import physical_cores

MODEL_ID = "local/bench-llama-gguf"
CLUSTER_KEY = "bench-serve-key"

PROMPT = "Request {tag}: write a long story about a fox who learns to cross a wide river, and tell it slowly."
"""The user message; `tag` differs per request so each prompt is evaluated past its first few
tokens (llama.cpp reuses the KV cache of a common prefix), identically in all three."""

SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}
"""What Skulk's engine passes to `Llama.generate` for a temperature-0 request (its defaults
for the knobs OpenAI lacks). Sent to both servers; Skulk ignores the fields it does not
take, whose defaults are these values."""

WARM_UP_TOKENS = 16
"""Tokens of each contender's untimed first request: pages the weights in, builds graphs;
its text, the same greedy prompt everywhere, checks that all three decode the same tokens."""

SERVER_START_DEADLINE_S = 180.0
"""The peer server loads the 380 MB model before it answers; on a loaded 2-core box that
has taken ~20 s. Hang guard only."""
NODE_START_DEADLINE_S = 60.0
TRACING_SWITCH_DEADLINE_S = 10.0
"""Hang guard for PUT /v1/tracing to take effect (one event through the node's own master)."""
"""A node answers its API within seconds; hang guard only."""
PLACE_DEADLINE_S = 300.0
"""Placement accepted and the runner Ready (spawn, load, engine warm-up). Hang guard only."""
MIN_DECODE_RATE_TOK_S = 0.25
"""Slowest decode a request may show before the run gives up on it (the slowest seen here
is ~2 tok/s): a request's deadline is REQUEST_SLACK_S + tokens / this."""
REQUEST_SLACK_S = 60.0
STOP_DEADLINE_S = 10.0
"""SIGTERM, then SIGKILL after this long."""

QUIET_FOREIGN_CORES = 0.25
"""Most cores processes outside the benchmark may use during a measurement that counts. On a
shared 2-core machine a neighbour's test run takes a core from llama.cpp's T threads, whose
barrier spinning then triples the CPU per token (seen here: 56 -> 170 ms/token, 35 -> 7
tok/s): such a figure measures the neighbour. A measurement starts after a window this quiet,
and one that was disturbed anyway is discarded and repeated (new prompt), until the quiet
budget (--quiet-budget) is spent; after that every measurement counts and is marked."""
QUIET_WINDOW_S = 1.0
QUIET_WAIT_PER_MEASUREMENT_S = 30.0
"""Longest wait for a quiet window before one attempt; it then runs anyway."""

BANDWIDTH_ARRAY_BYTES = 256 * 2**20
"""Per-process array for the bandwidth probe: far beyond any L3 slice, so reads stream DRAM."""
BANDWIDTH_ROUNDS = 5
BANDWIDTH_DEADLINE_S = 120.0


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


SPECS: dict[str, TinySpec] = {"bench": BENCH_SPEC, "tiny": TINY_SPEC}
"""--spec: `bench` (the default, ~380 MB) is large enough that decode is bound by memory, as
with a real model; `tiny` (5 MB, thousands of tokens/s) makes each server's per-token
overhead dominate, which is where a Python-heavy serving path shows."""


def ensure_bench_model(model_dir: Path | None, spec: TinySpec = BENCH_SPEC) -> Path:
    """The `spec` GGUF: generated on first use into a directory named by its spec hash
    (written beside it, then renamed into place, so a directory that exists is complete)."""
    digest = spec_hash(spec)[:16]
    target = model_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "skulk-bench" / digest
    gguf = target / GGUF_FILE_NAME
    if gguf.is_file():
        return gguf
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"generating the benchmark model into {target} (about 10 s) ...", flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.partial-") as tmp:
        generate_tiny_model(Path(tmp) / "model", spec)
        try:
            os.replace(Path(tmp) / "model", target)
        except OSError:
            if not gguf.is_file():  # not a concurrent run that finished first
                raise
    return gguf


def bytes_per_token(gguf: Path, spec: TinySpec = BENCH_SPEC) -> int:
    """Weight bytes read per decoded token: every weight matrix once, one row of the
    embedding table (the KV cache of a short context is negligible beside them)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    read = 0
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            read += int(tensor.n_bytes) // spec.vocab_size
        else:
            read += int(tensor.n_bytes)
    return read


def card_toml(gguf: Path, flash_attn: bool, spec: TinySpec = BENCH_SPEC) -> str:
    """A local-path card for the generated GGUF (shape from `spec`)."""
    backends = ["llama_cpp", "llama_cpp-cpu", "llama_cpp-cuda", "llama_cpp-vulkan", "llama_cpp-metal"]
    preference = ["llama_cpp-cuda", "llama_cpp-metal", "llama_cpp-vulkan", "llama_cpp-cpu", "llama_cpp"]
    return "\n".join([
        f"model_id = {json.dumps(MODEL_ID)}",
        'name = "Benchmark Llama (generated, GGUF)"',
        'family = "llama"',
        'source = "local-path"',
        f"local_path = {json.dumps(str(gguf.parent.resolve()))}",
        f"gguf_file = {json.dumps(gguf.name)}",
        'quantization = "f32"',
        f"storage_size_bytes = {gguf.stat().st_size}",
        'tasks = ["TextGeneration"]',
        'capabilities = ["text"]',
        f"num_layers = {spec.num_layers}",
        f"hidden_size = {spec.hidden_size}",
        f"num_attention_heads = {spec.num_attention_heads}",
        f"num_key_value_heads = {spec.num_key_value_heads}",
        f"head_dim = {spec.head_dim}",
        f"vocab_size = {spec.vocab_size}",
        f"context_length = {spec.context_length}",
        "",
        "[placement]",
        f"compatible_backends = {json.dumps(backends)}",
        f"backend_preference = {json.dumps(preference)}",
        "",
        "[runtime]",
        f"flash_attn = {'true' if flash_attn else 'false'}",
        "",
    ])


# ---------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------


def _bandwidth_worker(barrier: Any, results: Any, rounds: int) -> None:
    data = np.ones(BANDWIDTH_ARRAY_BYTES // 4, dtype=np.float32)
    data.max()  # fault the pages in before timing
    for round_index in range(rounds):
        barrier.wait(timeout=BANDWIDTH_DEADLINE_S)
        started = time.perf_counter()
        data.max()  # SIMD compare, no arithmetic chain: the fastest plain read numpy has here
        results.put((round_index, started, time.perf_counter()))


def read_bandwidth_bytes_s(processes: int) -> float:
    """Best aggregate read rate over BANDWIDTH_ROUNDS: `processes` workers read private arrays
    at the same moment; a round's rate is all their bytes over first start -> last end."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_bandwidth_worker, args=(barrier, results, BANDWIDTH_ROUNDS), daemon=True)
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        spans: dict[int, list[tuple[float, float]]] = {}
        for _ in range(processes * BANDWIDTH_ROUNDS):
            round_index, start, end = results.get(timeout=BANDWIDTH_DEADLINE_S)
            spans.setdefault(round_index, []).append((start, end))
    finally:
        for worker in workers:
            worker.join(timeout=STOP_DEADLINE_S)
            if worker.is_alive():
                worker.kill()
    return max(processes * BANDWIDTH_ARRAY_BYTES / (max(e for _, e in s) - min(b for b, _ in s))
               for s in spans.values())


# ---------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One request as the client saw it: when it was sent, when each token (or content
    delta) arrived, the text, and the prompt tokens where the contender reports them."""

    sent_at: float
    arrivals: tuple[float, ...]
    text: str
    prompt_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0] - self.sent_at

    @property
    def decode_tok_s(self) -> float:
        return (len(self.arrivals) - 1) / (self.arrivals[-1] - self.arrivals[0])


@dataclass(frozen=True)
class Sample:
    """One timed request, with the CPU the machine spent while it ran (cores = CPU s / wall s)."""

    stream: Stream
    wall_s: float
    cpu_s: float
    """CPU of this process (engine or client) plus the measured contender's process tree."""
    idle_cores: dict[str, float]
    """Each other contender's process tree, idle meanwhile: its background cost."""
    foreign_cores: float
    """Everything else on the machine: processes that are not part of this benchmark."""
    steal_cores: float
    """CPU the hypervisor gave to other guests."""

    @property
    def cpu_ms_per_token(self) -> float:
        return self.cpu_s * 1000 / len(self.stream.arrivals)


def _cpu_s(pids: Sequence[int], *, with_children: bool = True) -> float:
    """CPU seconds of `pids` (and, by default, all their descendants) so far."""
    total = 0.0
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            if with_children:
                procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def _machine_cpu_s() -> tuple[float, float]:
    """(busy CPU seconds, steal seconds) of the whole machine so far."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0)


class Contender:
    """Something that streams a chat completion: the engine, the peer or Skulk."""

    name: str

    def pids(self) -> list[int]:
        """Processes (with their children) that do this contender's work, besides this one."""
        return []

    def stream(self, user_message: str, max_tokens: int) -> Stream:
        raise NotImplementedError

    def prepare(self) -> None:
        """Before each measured request, outside the timing (the traced contender turns
        tracing on here)."""

    def release(self) -> None:
        """After each measured request, outside the timing."""


def measure(contender: Contender, everyone: Sequence[Contender], user_message: str, max_tokens: int) -> Sample:
    """Stream one request from `contender`, accounting the machine's CPU meanwhile."""

    def snapshot() -> tuple[float, float, float, dict[str, float]]:
        busy, steal = _machine_cpu_s()
        # This process alone: the servers and the node are its children, accounted apart.
        own = _cpu_s([os.getpid()], with_children=False) + _cpu_s(contender.pids())
        others = {c.name: _cpu_s(c.pids()) for c in everyone
                  if c is not contender and c.pids() and not set(c.pids()) & set(contender.pids())}
        return busy, steal, own, others

    busy0, steal0, own0, others0 = snapshot()
    wall0 = time.perf_counter()
    stream = contender.stream(user_message, max_tokens)
    wall = time.perf_counter() - wall0
    busy1, steal1, own1, others1 = snapshot()
    if len(stream.arrivals) < 2:
        raise RuntimeError(f"{contender.name}: {len(stream.arrivals)} tokens streamed; need at least 2 to time decode")
    idle = {name: (others1[name] - others0[name]) / wall for name in others0}
    foreign = max(0.0, (busy1 - busy0) - (own1 - own0) - sum(idle.values()) * wall) / wall
    return Sample(stream, wall, own1 - own0, idle, foreign, (steal1 - steal0) / wall)


def foreign_cores_now(everyone: Sequence[Contender], window_s: float = QUIET_WINDOW_S) -> float:
    """Cores used over `window_s` by processes that are not this benchmark's."""

    def ours() -> float:
        pids = sorted({pid for c in everyone for pid in c.pids()})  # skulk and skulk-tr share one node
        return _cpu_s([os.getpid()], with_children=False) + _cpu_s(pids)

    busy0, _ = _machine_cpu_s()
    ours0, wall0 = ours(), time.perf_counter()
    time.sleep(window_s)  # a sampling window, not synchronisation
    busy1, _ = _machine_cpu_s()
    wall = time.perf_counter() - wall0
    return max(0.0, (busy1 - busy0) - (ours() - ours0)) / wall


def wait_for_quiet(everyone: Sequence[Contender], budget_s: float) -> tuple[bool, float]:
    """Wait, at most min(budget_s, QUIET_WAIT_PER_MEASUREMENT_S), for a quiet window.
    Returns (quiet, seconds waited)."""
    if budget_s <= 0:
        return False, 0.0
    started = time.monotonic()
    limit = min(budget_s, QUIET_WAIT_PER_MEASUREMENT_S)
    while True:
        if foreign_cores_now(everyone) < QUIET_FOREIGN_CORES:
            return True, time.monotonic() - started
        if time.monotonic() - started >= limit:
            return False, time.monotonic() - started


class Engine(Contender):
    """(a) llama_cpp.Llama in this process, Llama.generate on the rendered prompt's tokens."""

    name = "engine"

    def __init__(self, gguf: Path, threads: int, n_ctx: int, flash_attn: bool) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.llama = llama_cpp.Llama(
            model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_gpu_layers=0,
            flash_attn=flash_attn, logits_all=False, verbose=False,
        )
        llama = self.llama
        vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))

        def text_of(token: int) -> str:
            return llama.detokenize([token], special=True).decode() if token >= 0 else ""

        self._formatter = Jinja2ChatFormatter(
            template=llama.metadata["tokenizer.chat_template"], eos_token=text_of(llama.token_eos()),
            bos_token=text_of(llama.token_bos()), add_generation_prompt=True,
        )

    def render(self, user_message: str) -> bytes:
        """The prompt text, rendered with the GGUF's chat template (outside the timing)."""
        return self._formatter(messages=[{"role": "user", "content": user_message}]).prompt.encode()

    def stream(self, user_message: str, max_tokens: int) -> Stream:
        prompt = self.render(user_message)
        sampling = {k: v for k, v in SAMPLING.items() if k != "temperature"}
        arrivals: list[float] = []
        tokens: list[int] = []
        sent_at = time.perf_counter()
        ids = self.llama.tokenize(prompt, add_bos=False, special=True)
        if self._add_bos and (not ids or ids[0] != self.llama.token_bos()):
            ids.insert(0, self.llama.token_bos())
        generator = self.llama.generate(ids, temp=SAMPLING["temperature"], reset=True, **sampling)
        try:
            for token in generator:
                arrivals.append(time.perf_counter())
                tokens.append(token)
                if len(tokens) >= max_tokens:
                    break
        finally:
            generator.close()
        return Stream(sent_at, tuple(arrivals), self.llama.detokenize(tokens).decode("utf-8", "replace"), len(ids))

    def close(self) -> None:
        self.llama.close()


class ChatServer(Contender):
    """An OpenAI-compatible server streamed over HTTP: (b) the peer or (c) Skulk."""

    def __init__(self, name: str, base_url: str, model: str, pids: list[int]) -> None:
        self.name = name
        self.base_url = base_url
        self.model = model
        self._pids = pids
        self._client = httpx.Client(timeout=httpx.Timeout(30.0, read=REQUEST_SLACK_S))

    def pids(self) -> list[int]:
        return self._pids

    def stream(self, user_message: str, max_tokens: int) -> Stream:
        body = {
            "model": self.model, "messages": [{"role": "user", "content": user_message}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, **SAMPLING,
        }
        deadline = time.monotonic() + REQUEST_SLACK_S + max_tokens / MIN_DECODE_RATE_TOK_S
        arrivals: list[float] = []
        parts: list[str] = []
        prompt_tokens = None
        sent_at = time.perf_counter()
        with self._client.stream("POST", self.base_url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"{self.name}: HTTP {response.status_code}: {response.text[:500]}")
            for line in response.iter_lines():
                now = time.perf_counter()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name}: request still streaming after its deadline")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"{self.name}: stream error: {event['error']}")
                if event.get("usage"):
                    prompt_tokens = event["usage"].get("prompt_tokens")
                for choice in event.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        arrivals.append(now)
                        parts.append(content)
        return Stream(sent_at, tuple(arrivals), "".join(parts), prompt_tokens)

    def prompt_tokens(self, user_message: str) -> int | None:
        """Prompt tokens as the server counts them (a one-token non-streaming request)."""
        body = {"model": self.model, "messages": [{"role": "user", "content": user_message}], "max_tokens": 1,
                **SAMPLING}
        response = self._client.post(self.base_url + "/v1/chat/completions", json=body)
        response.raise_for_status()
        return response.json().get("usage", {}).get("prompt_tokens")

    def close(self) -> None:
        self._client.close()


class TracedChatServer(ChatServer):
    """(c') the same Skulk node with cluster-wide tracing on for its requests (`--tracing`):
    tracing is switched on before each of its requests and off after, outside the timing,
    so the untraced contender always runs with it off."""

    def _set_tracing(self, enabled: bool) -> None:
        response = self._client.put(self.base_url + "/v1/tracing", json={"enabled": enabled})
        if response.status_code != 202:
            raise RuntimeError(f"PUT /v1/tracing: {response.status_code} {response.text}")
        poll(lambda: self._client.get(self.base_url + "/v1/tracing").json()["enabled"] is enabled,
             timeout_s=TRACING_SWITCH_DEADLINE_S, what=f"tracing {enabled}")

    def prepare(self) -> None:
        self._set_tracing(True)

    def release(self) -> None:
        self._set_tracing(False)


def tracing_off_cost_ns() -> tuple[float, float]:
    """What tracing costs the serving path when it is off, measured here in-process: the
    per-request decision (`begin_trace`: the replicated flag read) and the per-chunk test
    (`stream.trace is not None`), in nanoseconds per call."""
    import timeit
    from types import SimpleNamespace

    from skulk.api.generation import begin_trace
    from skulk.observe.traces import TraceStore
    from skulk.shared.types.state import State

    state = State()
    context = SimpleNamespace(traces=TraceStore("n", "n", None), get_state=lambda: state)
    stream = SimpleNamespace(trace=None)
    calls = 200_000
    per_request = min(timeit.repeat(lambda: begin_trace(context, "c", "m"), number=calls, repeat=3)) / calls
    per_chunk = min(timeit.repeat(lambda: stream.trace is not None, number=calls, repeat=3)) / calls
    return per_request * 1e9, per_chunk * 1e9


def tracing_on_cost_ns(tokens: int = 2048) -> float:
    """The span bookkeeping a traced token costs on its way, measured in-process: the
    runner's `RunnerSpans.token`, the worker's `WorkerTraces.frame` and the API's
    `RequestTrace.chunk`, in nanoseconds per token (the best of three runs of `tokens`)."""
    from types import SimpleNamespace

    from skulk.observe.traces import RequestTrace, TraceStore, WorkerTraces
    from skulk.worker.runner.spans import RunnerSpans

    best = float("inf")
    for _ in range(3):
        store = TraceStore("n", "n", None)
        worker = WorkerTraces(store)
        worker.dispatched(SimpleNamespace(traced=True, task_id="t", command_id="c", instance_id="i"), "r")
        request, runner = RequestTrace(store, "c", "m"), RunnerSpans()
        runner.started()
        started = time.perf_counter()
        for _ in range(tokens):
            runner.token()
            worker.frame("c", "n", True, False)
            request.chunk()
        best = min(best, (time.perf_counter() - started) / tokens)
    return best * 1e9


# ---------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------


@dataclass
class PeerServer:
    """`python -m llama_cpp.server` on a free loopback port, logging to a file."""

    gguf: Path
    threads: int
    n_ctx: int
    flash_attn: bool
    log_path: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PeerServer:
        self.port = free_port()
        args = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--model_alias", MODEL_ID,
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads), "--n_gpu_layers", "0",
            "--flash_attn", "true" if self.flash_attn else "false",
        ]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self) -> PeerServer:
        wait_answering(self.proc, lambda: httpx.get(self.url + "/v1/models", timeout=5).status_code == 200,
                       SERVER_START_DEADLINE_S, "llama_cpp.server", self.log)
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_DEADLINE_S)
        self._log.close()


def set_omp_wait_policy(policy: str) -> str:
    """Apply --omp-wait-policy to this process's environment (the peer and the node inherit it)
    and say what is in force. libgomp reads it once, when llama.cpp's library loads: this must
    run before anything here loads llama_cpp."""
    maps = Path("/proc/self/maps")
    if maps.exists() and "libgomp" in maps.read_text():
        raise RuntimeError("libgomp is already loaded; OMP_WAIT_POLICY would not apply to the engine")
    if policy == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"


def peer_server_available() -> str | None:
    """None when llama_cpp.server can start here; else what is missing."""
    missing = [m for m in ("sse_starlette", "starlette_context", "pydantic_settings", "fastapi", "uvicorn")
               if not _importable(m)]
    return f"missing {', '.join(missing)}" if missing else None


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def start_skulk(root: Path, gguf: Path, flash_attn: bool, spec: TinySpec = BENCH_SPEC) -> NodeProcess:
    data_dir = root / "skulk"
    cards = data_dir / "custom_model_cards"
    cards.mkdir(parents=True)
    (cards / (MODEL_ID.replace("/", "--") + ".toml")).write_text(card_toml(gguf, flash_attn, spec))
    port = free_port()
    node = NodeProcess(data_dir=data_dir, api_port=free_port(), extra_args=[
        "--listen", f"tcp/127.0.0.1:{port}", "--cluster-key", CLUSTER_KEY, "--node-name", "bench",
    ], env={API_KEY_ENV: ""})  # a private loopback node: no key, whatever this shell exports
    return node.start()


def poll(condition: Callable[[], Any], *, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Call `condition` until it returns something truthy, and return that. Only connection
    errors are retried: anything else `condition` raises ends the wait at once (unlike
    tests.nodeproc.wait_for, which retries through every exception until its deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            value = condition()
            if value:
                return value
        time.sleep(interval_s)  # polling interval
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_answering(proc: subprocess.Popen, answers: Callable[[], bool], timeout_s: float, what: str,
                   log: Callable[[], str]) -> None:
    """Poll `answers` until it is true; a process that exits fails the run at once, with its log."""

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log()[-3000:]}")
        return answers()

    try:
        poll(up, timeout_s=timeout_s, what=what)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{log()[-3000:]}") from None


def place_on_skulk(node: NodeProcess) -> dict:
    """POST /place_instance (retried while node info is still gossiping: 503), then wait
    until every runner is Ready. Returns the instance as /instance/{id} shows it."""

    def placed() -> dict | None:
        response = httpx.post(node.url + "/place_instance", json={"modelId": MODEL_ID}, timeout=10)
        if response.status_code == 503:
            return None
        if response.status_code != 200:
            raise RuntimeError(f"place_instance: {response.status_code} {response.text}")
        return response.json()

    deadline = time.monotonic() + PLACE_DEADLINE_S
    instance_id = poll(placed, timeout_s=PLACE_DEADLINE_S, interval_s=0.25, what="placement")["instanceId"]

    def ready() -> dict | None:
        response = node.get(f"/instance/{instance_id}")
        if response.status_code != 200:
            return None
        body = response.json()
        runners = list(body["runners"].values())
        failed = [r for r in runners if r["state"] == "Failed"]
        if failed:
            raise RuntimeError(f"runner failed: {failed}\n{node.log()[-3000:]}")
        return body if runners and all(r["state"] in ("Ready", "Running") for r in runners) else None

    try:
        return poll(ready, timeout_s=max(1.0, deadline - time.monotonic()), interval_s=0.25,
                    what=f"instance {instance_id} ready")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{node.log()[-3000:]}") from None


def skulk_engine_settings(node: NodeProcess) -> dict[str, str]:
    """What the runner logged when it loaded: n_ctx, threads, flash_attn."""
    matches = re.findall(r"loaded \S+: n_ctx=(\d+) threads=(\d+) flash_attn=(\w+)", node.log())
    return dict(zip(("n_ctx", "threads", "flash_attn"), matches[-1], strict=True)) if matches else {}


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _spread(values: Sequence[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    med = _median(values) * scale
    return f"{med:{fmt}} ({min(values) * scale:{fmt}}..{max(values) * scale:{fmt}})"


def report(samples: dict[str, list[Sample]], roofline_tok_s: float, tokens: int) -> None:
    print()
    print(f"{'':8} {'TTFT ms, median (min..max)':>28} {'decode tok/s, median (min..max)':>33} "
          f"{'CPU ms/token':>13} {'foreign':>8} {'steal':>6}")
    for name, runs in samples.items():
        ttft = [s.stream.ttft_s for s in runs]
        rate = [s.stream.decode_tok_s for s in runs]
        cpu = _median([s.cpu_ms_per_token for s in runs])
        foreign = _median([s.foreign_cores for s in runs])
        steal = _median([s.steal_cores for s in runs])
        print(f"{name:8} {_spread(ttft, 1000, '.0f'):>28} {_spread(rate):>33} {cpu:>13.1f} {foreign:>8.2f} "
              f"{steal:>6.2f}")
    print(f"{'roofline':8} {'':>28} {roofline_tok_s:>33.2f}")
    print("(CPU ms/token: the contender's processes and this client, per streamed token; foreign and steal:")
    print(" cores used meanwhile by processes outside the benchmark, and by the hypervisor's other guests)")
    idle: dict[str, list[float]] = {}
    for runs in samples.values():
        for sample in runs:
            for name, cores in sample.idle_cores.items():
                idle.setdefault(name, []).append(cores)
    if idle:
        print("idle background while the others were measured (median cores): "
              + ", ".join(f"{name} {_median(values):.3f}" for name, values in idle.items()))
    deltas = {name: {len(s.stream.arrivals) for s in runs} for name, runs in samples.items()}
    short = {name: sorted(d) for name, d in deltas.items() if d != {tokens}}
    if short:
        print(f"note: content deltas per request differ from {tokens}: {short}")

    med = {name: (_median([s.stream.ttft_s for s in runs]), _median([s.stream.decode_tok_s for s in runs]))
           for name, runs in samples.items()}
    print()
    if "skulk" in med and "engine" in med:
        print(f"skulk / engine   decode {med['skulk'][1] / med['engine'][1]:.3f}   "
              f"TTFT {med['skulk'][0] / med['engine'][0]:.2f}x  "
              f"({(med['skulk'][0] - med['engine'][0]) * 1000:+.0f} ms)")
    if "skulk" in med and "peer" in med:
        print(f"skulk / peer     decode {med['skulk'][1] / med['peer'][1]:.3f}   "
              f"TTFT {med['skulk'][0] / med['peer'][0]:.2f}x  "
              f"({(med['skulk'][0] - med['peer'][0]) * 1000:+.0f} ms)")
    if "peer" in med and "engine" in med:
        print(f"peer / engine    decode {med['peer'][1] / med['engine'][1]:.3f}   "
              f"TTFT {med['peer'][0] / med['engine'][0]:.2f}x")
    if "engine" in med:
        print(f"engine / roofline decode {med['engine'][1] / roofline_tok_s:.3f}")
    if "skulk" in med and "skulk-tr" in med:
        print(f"traced / skulk   decode {med['skulk-tr'][1] / med['skulk'][1]:.3f}   "
              f"TTFT {med['skulk-tr'][0] / med['skulk'][0]:.2f}x  (tracing on vs off, same node)")
        per_request_ns, per_chunk_ns = tracing_off_cost_ns()
        token_ns = 1e9 / med["skulk"][1]
        print(f"tracing off      {per_request_ns:.0f} ns per request + {per_chunk_ns:.0f} ns per token "
              f"(measured in-process) = {per_chunk_ns / token_ns * 100:.4f} % of a token at "
              f"{med['skulk'][1]:.1f} tok/s")
        on_ns = tracing_on_cost_ns()
        print(f"tracing on       {on_ns:.0f} ns of span bookkeeping per token (runner + worker + API, in-process) "
              f"= {on_ns / token_ns * 100:.3f} % of a token at {med['skulk'][1]:.1f} tok/s")


# ---------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------


def rounds(contenders: list[Contender], reps: int) -> Iterator[tuple[int, Contender]]:
    """Round r runs every contender, starting with contender r mod len (rotating order)."""
    for r in range(reps):
        for i in range(len(contenders)):
            yield r, contenders[(r + i) % len(contenders)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128, help="decoded tokens per request")
    parser.add_argument("--reps", type=int, default=5, help="timed requests per contender (median reported)")
    parser.add_argument("--threads", type=int, default=physical_cores(),
                        help="llama.cpp threads for the engine and the peer, and bandwidth probe processes "
                             "(default: physical cores, what Skulk's runner uses)")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on",
                        help="llama.cpp Flash Attention for all three (Skulk's default is on)")
    parser.add_argument("--model-dir", type=Path, default=None, help="where the benchmark GGUF is (or is generated)")
    parser.add_argument("--spec", choices=sorted(SPECS), default="bench",
                        help="bench: ~380 MB, memory-bound like a real model; tiny: 5 MB, per-token overhead dominates")
    parser.add_argument("--omp-wait-policy", choices=("asis", "passive"), default="asis",
                        help="asis: each contender as shipped; passive: OMP_WAIT_POLICY=PASSIVE for all three")
    parser.add_argument("--quiet-budget", type=float, default=120.0,
                        help="seconds the run may spend waiting for quiet and repeating measurements that other "
                             "processes disturbed (0: take every measurement as it comes)")
    parser.add_argument("--skip-peer", action="store_true", help="leave out llama-cpp-python's server (b)")
    parser.add_argument("--tracing", action="store_true",
                        help="add (c') the same Skulk node with tracing on, and the cost of tracing when off")
    args = parser.parse_args()
    if args.tokens < 2 or args.reps < 1 or args.threads < 1:
        parser.error("need --tokens >= 2, --reps >= 1, --threads >= 1")
    threads, flash_attn = args.threads, args.flash_attn == "on"
    omp_note = set_omp_wait_policy(args.omp_wait_policy)

    started = time.monotonic()
    spec = SPECS[args.spec]
    gguf = ensure_bench_model(args.model_dir, spec)
    read_bytes = bytes_per_token(gguf, spec)
    print(f"model      {gguf} ({gguf.stat().st_size / 1e6:.0f} MB file, {spec.parameter_count / 1e6:.1f} M "
          f"params f32; {read_bytes / 1e6:.0f} MB of weights read per token)")
    print(f"machine    {os.cpu_count()} logical / {physical_cores()} physical cores; "
          f"load average {os.getloadavg()[0]:.2f}; threads T={threads}; flash_attn={flash_attn}; {omp_note}")
    if threads != physical_cores():
        print(f"warning    Skulk has no thread setting: its runner uses physical_cores()={physical_cores()} "
              f"threads, while (a) and (b) use {threads}")
    print(f"request    {args.tokens} tokens, greedy ({json.dumps(SAMPLING)}), {args.reps} timed reps each, "
          f"interleaved", flush=True)

    bandwidth = read_bandwidth_bytes_s(threads)
    roofline = bandwidth / read_bytes
    print(f"roofline   read bandwidth {bandwidth / 1e9:.1f} GB/s with {threads} processes / "
          f"{read_bytes / 1e6:.0f} MB per token = {roofline:.1f} tok/s", flush=True)

    peer_missing = "left out (--skip-peer)" if args.skip_peer else peer_server_available()
    if peer_missing:
        print(f"peer       skipped: {peer_missing}; run with `uv run --with sse-starlette --with starlette-context "
              f"--with pydantic-settings python bench/serve.py`")

    contenders: list[Contender] = []
    node: NodeProcess | None = None
    peer: PeerServer | None = None
    engine: Engine | None = None
    with tempfile.TemporaryDirectory(prefix="skulk-bench-serve-") as tmp:
        root = Path(tmp)
        try:
            node = start_skulk(root, gguf, flash_attn, spec)
            wait_answering(node.proc, lambda: node.get("/node_id").status_code == 200, NODE_START_DEADLINE_S,
                           "skulk node", node.log)
            wait_agreed([node], members=1, what="single-node cluster")
            instance = place_on_skulk(node)
            n_ctx = min(int(instance.get("contextTokenLimit") or spec.context_length), spec.context_length)
            settings = skulk_engine_settings(node)
            backends = sorted({s.get("backend", "?") for s in instance.get("shards", [])})
            print(f"skulk      placed {instance.get('instanceId')} on {backends}, runner loaded with {settings}",
                  flush=True)
            if not peer_missing:
                peer = PeerServer(gguf, threads, n_ctx, flash_attn, root / "peer.log").start().wait_ready()
            engine = Engine(gguf, threads, n_ctx, flash_attn)

            contenders.append(engine)
            if peer is not None:
                contenders.append(ChatServer("peer", peer.url, MODEL_ID, [peer.proc.pid]))
            skulk = ChatServer("skulk", node.url, MODEL_ID, [node.proc.pid])
            contenders.append(skulk)
            if args.tracing:
                contenders.append(TracedChatServer("skulk-tr", node.url, MODEL_ID, [node.proc.pid]))

            warm = PROMPT.format(tag="warm-up")
            counts, texts = {}, {}
            for contender in contenders:
                texts[contender.name] = contender.stream(warm, WARM_UP_TOKENS).text
                counts[contender.name] = (len(engine.llama.tokenize(engine.render(warm), add_bos=False, special=True))
                                          if contender is engine else contender.prompt_tokens(warm))
            print(f"prompt     {counts} tokens (same rendered prompt everywhere when equal)")
            same = len(set(texts.values())) == 1
            print(f"greedy     warm-up text identical across {sorted(texts)}: {'yes' if same else 'NO'}", flush=True)
            if not same:
                for name, text in texts.items():
                    print(f"  {name}: {text!r}")

            samples: dict[str, list[Sample]] = {c.name: [] for c in contenders}
            budget_s, discarded = args.quiet_budget, 0
            for r, contender in rounds(contenders, args.reps):
                for attempt in itertools.count():
                    waited = wait_for_quiet(contenders, budget_s)[1]
                    contender.prepare()
                    try:
                        sample = measure(contender, contenders, PROMPT.format(tag=f"{r}.{attempt}"), args.tokens)
                    finally:
                        contender.release()
                    budget_s = max(0.0, budget_s - waited)
                    disturbed = sample.foreign_cores >= QUIET_FOREIGN_CORES
                    print(f"  round {r} {contender.name:6} TTFT {sample.stream.ttft_s * 1000:6.0f} ms  "
                          f"decode {sample.stream.decode_tok_s:6.2f} tok/s  CPU {sample.cpu_ms_per_token:5.1f} "
                          f"ms/token  foreign {sample.foreign_cores:.2f} cores"
                          + ((" (disturbed: repeated)" if budget_s > 0 else " (disturbed: kept)") if disturbed else ""),
                          flush=True)
                    if not disturbed or budget_s <= 0:
                        break
                    budget_s = max(0.0, budget_s - sample.wall_s)
                    discarded += 1
                samples[contender.name].append(sample)
            report(samples, roofline, args.tokens)
            kept = sum(s.foreign_cores >= QUIET_FOREIGN_CORES for runs in samples.values() for s in runs)
            print(f"disturbed (others used >= {QUIET_FOREIGN_CORES} cores): {discarded} measurements repeated, "
                  f"{kept} kept once the quiet budget was spent; {args.quiet_budget - budget_s:.0f} of "
                  f"{args.quiet_budget:.0f} s of quiet budget used")
            print(f"\nload average at the end {os.getloadavg()[0]:.2f}; whole run {time.monotonic() - started:.0f} s")
        finally:
            for contender in contenders:
                if isinstance(contender, ChatServer):
                    contender.close()
            if engine is not None:
                engine.close()
            if peer is not None:
                peer.stop()
            if node is not None:
                node.stop()


if __name__ == "__main__":
    main()
