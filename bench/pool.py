"""llama.cpp memory pooling benchmark: one GGUF, decode tok/s and TTFT, side by side in one run.

Configurations (every one on this machine, loopback, the same GGUF, greedy, same prompts):
- one node: the in-process llama.cpp engine alone (every layer local);
- skulk pool: the same engine as a 2-rank pool (driver + a donor runner process), bytes
  through the authenticated, encrypted pool channel (`skulk.pool.channel`);
- skulk pool, plain: the same, channel authenticated but not encrypted (SKULK_POOL_ENCRYPT=0),
  to measure what encryption costs;
- direct RPC: the same driver code dialling a ggml RPC server with no channel at all (the
  channel's whole cost is the difference);
- llama.cpp RPC: llama.cpp's own setup from the same pinned source, `llama-server --rpc` to
  `ggml-rpc-server`, timed from its streamed tokens;
- llama-server alone: the same server without RPC, so the engine difference (C++ server loop
  vs the in-process engine's Python token loop) reads apart from the pooling's cost.

Our configurations run as a node runs its engine processes: the bench re-executes itself
once with huge-page malloc (`skulk.worker.engines.hugepages`, SKULK_HUGEPAGES=0 turns it
off), while llama.cpp's binaries run with the environment the bench was started with, as
llama.cpp's users run them.

`--stages` adds rows that cross drivers, donors and channels (our driver to
`ggml-rpc-server`, llama-server to our donor or through our channel, our driver through the
channel's processes), llama.cpp's own RPC given the same huge-page malloc (how much of the
difference that alone makes), the driver-side link as threads vs as a process of its own,
flash attention off, a 0.5 ms GIL switch interval, and the headline row a second time
(their spread is the run's own noise); `--only "a;b"` runs just those rows, loaded in that
order.

Every pooled configuration splits the layers the same way (half on each side, the output
layer on the donor). All processes share this machine's cores, so pooled figures measure the
protocol's cost, not the capacity of a second machine. Prints ratios against llama.cpp's own
RPC (the issue's target: skulk pool >= 0.95x) and against one node.

Usage: uv run python bench/pool.py [--tokens 32] [--requests 3] [--threads 1]
  default model: the generator's BENCH_SPEC GGUF (95 M params, ~380 MB f32), written once to
  --models-dir; --tiny uses the 5 MB test model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.models.tiny_models import BENCH_SPEC, TINY_SPEC, generate_tiny_model
from skulk.pool.layout import derive_pool_key, device_split
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.tasks import TextGenerationParams

WORDS = ["the", "cluster", "by", "the", "sea", "holds", "a", "node", "that", "serves", "a", "model", "to", "everyone", "who", "asks"]
KEY = derive_pool_key("bench-cluster-key")


def gguf_path(models_dir: Path, tiny: bool) -> tuple[Path, object]:
    spec = TINY_SPEC if tiny else BENCH_SPEC
    target = models_dir / ("tiny" if tiny else "bench")
    found = sorted(target.glob("**/*.gguf"))
    if not found:
        print(f"writing the {'tiny' if tiny else 'bench'} model to {target} ...", flush=True)
        generate_tiny_model(target, spec)
        found = sorted(target.glob("**/*.gguf"))
    return found[0], spec


def card_for(spec):
    return load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml").model_copy(
        update={"num_layers": spec.num_layers, "hidden_size": spec.hidden_size})


def instance(card, world: int) -> Instance:
    per = [card.num_layers // world] * world
    per[-1] += card.num_layers - sum(per)
    shards, start = [], 0
    for rank, count in enumerate(per):
        shards.append(ShardAssignment(node_id=f"bench-{rank}", runner_id=f"r{rank}", rank=rank, world_size=world,
                                      start_layer=start, end_layer=start + count, backend="llama_cpp-cpu"))
        start += count
    return Instance(instance_id=f"bench-pool-{os.getpid()}-{time.monotonic_ns()}", model_id=card.model_id,
                    sharding="Pipeline", shards=shards, context_token_limit=2048,
                    ring_hosts=["127.0.0.1"] * world if world > 1 else [])


def _donor(inst: Instance, card, path: str, threads: int, encrypt: str, cache_dir: str = "") -> None:
    os.environ["SKULK_POOL_ENCRYPT"] = encrypt
    os.environ["SKULK_POOL_TENSOR_CACHE_DIR"] = cache_dir
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.pool import PoolDonorEngine

    PoolDonorEngine().load(ShardSpec(instance=inst, runner_id="r1", card=card, model_path=path, n_threads=threads,
                                     pool_key=KEY))
    while True:
        time.sleep(3600)


def _rpc_server_direct(port_out, threads: int) -> None:
    from skulk.pool import rpc

    port_out.put(rpc.start_server(threads))
    while True:
        time.sleep(3600)


def _gate_process(port_out, rpc_port: int, key: bytes, encrypt: bool) -> None:
    """A donor's gate in front of an RPC server, in its own process (as on a donor node)."""
    from skulk.pool.channel import DonorGate

    gate = DonorGate("127.0.0.1", 0, key, rpc_port, encrypt=encrypt)
    gate.start()
    port_out.put(gate.port)
    while True:
        time.sleep(3600)


def _link_process(port_out, gate_port: int, key: bytes, encrypt: bool) -> None:
    """A driver's link to that gate, in its own process (as in a driver runner)."""
    from skulk.pool.channel import DriverLink, Remote

    def lost(remote, why) -> None:
        print(f"FATAL link lost {remote.name}: {why}", flush=True)
        os._exit(9)

    link = DriverLink(Remote("127.0.0.1", gate_port, "bench donor"), key, lost, encrypt=encrypt)
    link.start()
    port_out.put(link.port)
    while True:
        time.sleep(3600)


def _answering_donor(port_out, gate_ports, answer_bytes: int) -> None:
    """Stands in for a donor's RPC server in the channel round-trip bench: reads one request
    (its length first), answers `answer_bytes` (a token's logits). Serves it directly and
    behind a plain and an encrypted gate, all in this one process, as on a donor node."""
    import socket

    from skulk.pool.channel import DonorGate

    server = socket.create_server(("127.0.0.1", 0))
    answer = os.urandom(answer_bytes)

    def serve(conn) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:  # ggml RPC's framing (`skulk.pool.framing`): | command | size | payload |
                head = conn.recv(9, socket.MSG_WAITALL)
                if len(head) < 9:
                    return
                need = int.from_bytes(head[1:], "little")
                while need:
                    got = conn.recv(min(need, 1 << 20))
                    if not got:
                        return
                    need -= len(got)
                conn.sendall(len(answer).to_bytes(8, "little"))  # answered as ggml's server does: size, then data
                conn.sendall(answer)

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    port_out.put(port)
    for encrypt in (False, True):
        gate = DonorGate("127.0.0.1", 0, KEY, port, encrypt=encrypt)
        gate.start()
        gate_ports.put(gate.port)
    while True:
        time.sleep(3600)


def channel_round_trips(rounds: int, trips: int, request_bytes: int, answer_bytes: int) -> None:
    """The channel's own cost per ggml RPC round trip, measured apart from any model:
    llama.cpp's RPC client waits for the donor about once per decoded token (the hidden
    state and graph go out asynchronously; it waits for the logits), so one round trip of
    (hidden state out, logits back) through the channel vs straight to the server is what
    the channel adds to each token. Interleaved rounds, medians."""
    import socket

    ctx = mp.get_context("spawn")
    ports, gate_ports = ctx.Queue(), ctx.Queue()
    donor = ctx.Process(target=_answering_donor, args=(ports, gate_ports, answer_bytes), daemon=True)
    donor.start()
    procs = [donor]
    try:
        direct = ports.get(timeout=60)
        endpoints = {"direct": direct}
        for name, encrypt in (("channel, plain", False), ("channel, encrypted", True)):
            gate_port = gate_ports.get(timeout=60)
            link = ctx.Process(target=_link_process, args=(ports, gate_port, KEY, encrypt), daemon=True)
            link.start()
            procs.append(link)
            endpoints[name] = ports.get(timeout=60)
        socks = {}
        for name, port in endpoints.items():
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks[name] = sock
        get_tensor = 10  # any command byte: the channel reads only the size
        request = bytes([get_tensor]) + request_bytes.to_bytes(8, "little") + os.urandom(request_bytes)
        expected = answer_bytes + 8  # the size, then the answer
        buffer = bytearray(expected)

        def trip(sock) -> float:
            t0 = time.perf_counter()
            sock.sendall(request)
            view, got = memoryview(buffer), 0
            while got < expected:
                n = sock.recv_into(view[got:])
                if not n:
                    raise RuntimeError("closed")
                got += n
            return time.perf_counter() - t0

        times: dict[str, list[float]] = {name: [] for name in socks}
        for sock in socks.values():  # warm up
            for _ in range(20):
                trip(sock)
        for _ in range(rounds):
            for name, sock in socks.items():
                times[name].extend(trip(sock) for _ in range(trips))
        base = statistics.median(times["direct"])
        print(f"\nchannel round trip ({request_bytes} B out, {answer_bytes} B back; {rounds} interleaved rounds x "
              f"{trips}; load average {os.getloadavg()[0]:.2f}):")
        for name, samples in times.items():
            med = statistics.median(samples)
            print(f"  {name:<20} median {med * 1e6:8.0f} us   added {(med - base) * 1e6:+8.0f} us per round trip")
        for sock in socks.values():
            sock.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.join(timeout=10)


def llama_cpp_env(huge_pages: bool) -> dict[str, str]:
    """The environment a llama.cpp binary runs with here: as its users run it (malloc on its
    default pages, GLIBC_TUNABLES as this bench was started), or with the huge-page malloc a
    Skulk node gives its engine processes (`huge_pages`, the --stages row that shows how much
    of the difference that alone makes)."""
    from skulk.worker.engines.hugepages import TUNABLES_ENV, tunables_with_hugepages

    env = dict(os.environ)
    started_with = env.pop(REEXEC_ENV, None)
    if huge_pages:
        env[TUNABLES_ENV] = tunables_with_hugepages(env.get(TUNABLES_ENV))
    elif started_with is not None:  # undo what the re-execution added
        if started_with:
            env[TUNABLES_ENV] = started_with
        else:
            env.pop(TUNABLES_ENV, None)
    return env


def start_ggml_rpc_server(bin_dir: Path, threads: int, log_path: Path,
                          huge_pages: bool = False) -> tuple[subprocess.Popen, int]:
    """llama.cpp's own `ggml-rpc-server` on loopback; (process, port) once it listens."""
    from skulk.pool.rpc import free_loopback_port

    port = free_loopback_port()
    proc = subprocess.Popen([str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                            env=llama_cpp_env(huge_pages), stdout=open(log_path, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115 (the server's log, open for its life)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("ggml-rpc-server did not listen")


def start_donor_endpoint(kind: str, threads: int, bin_dir: Path, logs: Path,
                         huge_pages: bool = False) -> tuple[str, Callable[[], None]]:
    """A donor RPC endpoint for a driver to dial, and how to stop it. kind:
    ggml (llama.cpp's ggml-rpc-server), lib (our in-process server from llama-cpp-python's
    libggml-rpc, as a donor runner starts it), ggml+channel / ggml+channel-plain (ggml-rpc-server
    behind our gate and link, each in its own process, encrypted or not)."""
    ctx = mp.get_context("spawn")
    procs: list = []

    def stop() -> None:
        for proc in procs:
            proc.kill()
            (proc.join if hasattr(proc, "join") else proc.wait)(timeout=10)

    try:
        if kind == "lib":
            ports = ctx.Queue()
            helper = ctx.Process(target=_rpc_server_direct, args=(ports, threads), daemon=True)
            helper.start()
            procs.append(helper)
            return f"127.0.0.1:{ports.get(timeout=60)}", stop
        server, port = start_ggml_rpc_server(bin_dir, threads, logs / f"rpc-{kind}.log", huge_pages)
        procs.append(server)
        if kind == "ggml":
            return f"127.0.0.1:{port}", stop
        encrypt = kind == "ggml+channel"
        ports = ctx.Queue()
        gate = ctx.Process(target=_gate_process, args=(ports, port, KEY, encrypt), daemon=True)
        gate.start()
        procs.append(gate)
        gate_port = ports.get(timeout=60)
        link = ctx.Process(target=_link_process, args=(ports, gate_port, KEY, encrypt), daemon=True)
        link.start()
        procs.append(link)
        return f"127.0.0.1:{ports.get(timeout=60)}", stop
    except BaseException:
        stop()
        raise


@dataclass
class Config:
    """One loaded configuration: `stream(params)` yields (token id, arrival time)."""

    stream: Callable
    load_s: float
    close: Callable[[], None]
    note: str = ""


def _fatal_exit(message: str) -> None:
    """A pooled driver lost its donor: llama.cpp's RPC client would abort the process on the
    closed socket, so the bench exits at once, first ending every process it started (donors,
    links, gates, llama.cpp servers): an exit that skips cleanup must not leave them behind."""
    import psutil

    print(f"FATAL {message}", flush=True)
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(9)


def _wait_port(port: int, deadline_s: float = 60) -> None:
    import socket

    end = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def open_engine(card, path: Path, threads: int, mode: str, cache_dir: str = "", bin_dir: Path | None = None,
                env: dict[str, str] | None = None, switch_interval: float | None = None) -> Config:
    """mode: one | pool | pool-plain (the production path: `LlamaCppEngine.load` of a 2-rank
    pool, with a donor runner's `PoolDonorEngine` in another process) | pool-link-thread /
    pool-link-process (our driver through the same encrypted channel, the driver-side link
    as threads of the driver's process or in a process of its own) | direct (our driver
    straight to our donor's RPC server, no channel) | direct-ggml (our driver straight to
    llama.cpp's ggml-rpc-server) | ggml+channel (our driver through the encrypted channel,
    link and gate each in a process of its own, to ggml-rpc-server). `env`: variables set while loading (restored after);
    `switch_interval`: `sys.setswitchinterval` while this configuration decodes."""
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    ctx = mp.get_context("spawn")
    helpers: list = []
    world = 1 if mode == "one" else 2
    inst = instance(card, world)
    engine = LlamaCppEngine()
    engine.set_fatal_handler(lambda kind, message: _fatal_exit(f"{kind}: {message}"))
    started = time.monotonic()
    saved = {name: os.environ.get(name) for name in (env or {})}
    os.environ.update(env or {})

    stop_endpoint: list[Callable[[], None]] = []
    links: list = []

    def close() -> None:
        engine.close()
        for link in links:
            link.close()
        for helper in helpers:
            helper.kill()
            helper.join(timeout=10)
        for stop in stop_endpoint:
            stop()

    try:
        if mode in ("pool", "pool-plain"):
            encrypt = "0" if mode == "pool-plain" else "1"
            os.environ["SKULK_POOL_ENCRYPT"] = encrypt  # read by the driver's links at load
            helpers.append(ctx.Process(target=_donor, args=(inst, card, str(path), threads, encrypt, cache_dir),
                                       daemon=True))
            helpers[-1].start()
            engine.load(ShardSpec(instance=inst, runner_id="r0", card=card, model_path=str(path),
                                  n_threads=threads, pool_key=KEY))
        elif mode in ("pool-link-thread", "pool-link-process"):
            from skulk.pool.layout import channel_key, pool_port

            helpers.append(ctx.Process(target=_donor, args=(inst, card, str(path), threads, "1"), daemon=True))
            helpers[-1].start()
            gate_port = pool_port(inst, 1)
            _wait_port(gate_port)
            key = channel_key(KEY, inst, 1)
            if mode == "pool-link-process":
                ports = ctx.Queue()
                helpers.append(ctx.Process(target=_link_process, args=(ports, gate_port, key, True), daemon=True))
                helpers[-1].start()
                endpoint = f"127.0.0.1:{ports.get(timeout=60)}"
            else:
                from skulk.pool.channel import DriverLink, Remote

                def lost(remote, why) -> None:
                    _fatal_exit(f"link lost {remote.name}: {why}")

                link = DriverLink(Remote("127.0.0.1", gate_port, "bench donor"), key, lost, encrypt=True)
                link.start()
                links.append(link)
                endpoint = link.endpoint
            _load_direct(engine, inst, card, path, threads, endpoint)
        elif mode == "direct":
            ports = ctx.Queue()
            helpers.append(ctx.Process(target=_rpc_server_direct, args=(ports, threads), daemon=True))
            helpers[-1].start()
            port = ports.get(timeout=60)
            _load_direct(engine, inst, card, path, threads, f"127.0.0.1:{port}")
        elif mode in ("direct-ggml", "ggml+channel"):
            assert bin_dir is not None
            logs = Path(tempfile.mkdtemp(prefix="pool-bench-"))
            stop_endpoint.append(lambda: shutil.rmtree(logs, ignore_errors=True))
            endpoint, stop = start_donor_endpoint("ggml" if mode == "direct-ggml" else mode, threads, bin_dir, logs)
            stop_endpoint.insert(0, stop)
            _load_direct(engine, inst, card, path, threads, endpoint)
        else:
            engine.load(ShardSpec(instance=inst, runner_id="r0", card=card, model_path=str(path), n_threads=threads))
    except BaseException:
        close()
        raise
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def stream(params):
        if switch_interval is None:
            yield from _stream_engine(engine, params)
            return
        before = sys.getswitchinterval()
        sys.setswitchinterval(switch_interval)
        try:
            yield from _stream_engine(engine, params)
        finally:
            sys.setswitchinterval(before)

    return Config(stream, time.monotonic() - started, close)


def _load_direct(engine, inst, card, path, threads, endpoint) -> None:
    """The driver's load with the channel removed: llama.cpp dials `endpoint` itself. The
    same llama.cpp options as the engine's own load (flash attention included), so only
    the path of the bytes differs from the production driver."""
    import llama_cpp

    from skulk.pool import rpc
    from skulk.worker.engines.hugepages import this_process_weights_in_malloc
    from skulk.worker.engines.llama_cpp.engine import flash_attn_enabled

    devices = rpc.add_servers([endpoint])
    split = device_split(inst.shards, card.num_layers)
    with rpc.model_devices(devices):
        llama = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                                n_gpu_layers=split.n_gpu_layers, tensor_split=list(split.tensor_split),
                                flash_attn=flash_attn_enabled(card.runtime.flash_attn, os.environ),
                                use_mmap=not this_process_weights_in_malloc(os.environ),
                                logits_all=False, verbose=False)
    engine._llama = llama  # the bench drives the engine's own generation loop over it
    engine._vocab = llama_cpp.llama_model_get_vocab(llama.model)
    engine._n_ctx = 2048
    engine._formatter = None
    engine._special_ids = {}
    engine._special_pattern = None


def _stream_engine(engine, params):
    return ((t.token_id, time.monotonic()) for t in engine.generate(params, threading.Event()))


def _one_request(stream, params) -> tuple[list[int], float, float | None, list[float]]:
    """(tokens, TTFT seconds, decode tok/s or None, gaps between tokens in seconds)."""
    t0 = time.monotonic()
    stamps, tokens = [], []
    for token, at in stream(params):
        tokens.append(token)
        stamps.append(at)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else None
    return tokens, stamps[0] - t0, rate, [b - a for a, b in itertools.pairwise(stamps)]


def _fast_rate(gaps: list[float]) -> float:
    """tok/s at the 10th percentile of the gaps between tokens: on a shared machine a token
    that waited behind other tenants' work is slow for reasons outside the configuration,
    while the quick tokens show what the configuration itself costs."""
    ordered = sorted(g for g in gaps if g > 0)
    return 1 / ordered[len(ordered) // 10] if ordered else float("nan")


def open_llama_server(card, path: Path, threads: int, bin_dir: Path, donor: str | None = "ggml",
                      huge_pages: bool = False) -> Config:
    """llama.cpp's own driver: llama-server --rpc to a donor endpoint (`start_donor_endpoint`
    kind; "ggml" is llama.cpp's own setup), same split; with `donor` None, llama-server alone
    (the engine difference without any pooling). `huge_pages`: driver and donor given what a
    node gives its engines (huge-page malloc, weights read rather than mapped)."""
    from tests.nodeproc import free_port

    http_port = free_port()
    split = device_split(instance(card, 2).shards, card.num_layers)
    logs = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    stop_donor: Callable[[], None] = lambda: None  # noqa: E731
    rpc_args = ["-ngl", "0"]
    if donor is not None:
        endpoint, stop_donor = start_donor_endpoint(donor, threads, bin_dir, logs, huge_pages)
        rpc_args = ["--rpc", endpoint, "-ngl", str(split.n_gpu_layers),
                    "-ts", ",".join(str(int(x)) for x in split.tensor_split)]
    if huge_pages:  # as our engine loads where huge-page malloc is on: weights read, not mapped
        rpc_args += ["-lm", "none"]
    pooled = donor is not None
    driver = None

    def close() -> None:
        if driver is not None:
            driver.kill()
            driver.wait(timeout=10)
        stop_donor()
        shutil.rmtree(logs, ignore_errors=True)

    try:
        started = time.monotonic()
        driver = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", str(path), *rpc_args,
             "-t", str(threads), "-tb", str(threads), "-c", "2048", "-np", "1", "--host", "127.0.0.1",
             "--port", str(http_port), "--no-warmup", "-lv", "4"],
            env=llama_cpp_env(huge_pages), stdout=open(logs / "server.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115 (the server's log, open for its life)
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((logs / "server.log").read_text()[-3000:])
            time.sleep(0.25)
    except BaseException:
        close()
        raise
    load_s = time.monotonic() - started
    note = ""
    if pooled:
        note = "layers on RPC: " + str("using device RPC0" in (logs / "server.log").read_text())

    def stream(params):
        body = {"prompt": params.prompt, "n_predict": params.max_tokens, "temperature": 0, "stream": True,
                "cache_prompt": False, "return_tokens": True}
        with httpx.stream("POST", url + "/completion", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                for token in event.get("tokens") or []:
                    yield token, time.monotonic()
                if event.get("stop"):
                    return

    return Config(stream, load_s, close, note)


REEXEC_ENV = "SKULK_BENCH_PLAIN_GLIBC_TUNABLES"
"""Set once this bench re-executed itself with a node's engine environment: the
GLIBC_TUNABLES it was started with (llama.cpp's own processes get that back)."""


def _as_a_node_runs_engines() -> None:
    """Re-execute this bench once with the environment a node gives its engine processes
    (huge-page malloc, `skulk.worker.engines.hugepages`; read by glibc at process start
    only), so our drivers (in this process) and donors (spawned) run as in production. The
    llama.cpp binaries are started with the original environment (`llama_cpp_env`)."""
    from skulk.worker.engines.hugepages import export_hugepage_malloc

    if REEXEC_ENV in os.environ:
        return
    env = dict(os.environ)
    env[REEXEC_ENV] = os.environ.get("GLIBC_TUNABLES", "")
    if export_hugepage_malloc(env):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--stages", action="store_true",
                        help="also cross drivers and donors: our driver to ggml-rpc-server, llama-server to our "
                             "donor's RPC server, llama-server through our channel (plain and encrypted)")
    parser.add_argument("--only", default="",
                        help="semicolon-separated configuration names to run, loaded in that order (one node, the "
                             "reference, always runs: first unless placed)")
    parser.add_argument("--cache-loads", action="store_true",
                        help="also time a pool's load with the donor's RPC tensor cache, cold and warm")
    parser.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "skulk-bench-models")
    parser.add_argument("--llama-bin-dir", type=Path,
                        default=Path.home() / ".cache/skulk/engines/0.3.36-cpu/build/bin")
    parser.add_argument("--channel-rtt", type=int, nargs="?", const=131072, default=None, metavar="ANSWER_BYTES",
                        help="only measure the channel's cost per RPC round trip (default answer 128 KiB: a "
                             "32k-vocabulary token's logits), direct vs plain vs encrypted")
    args = parser.parse_args()
    _as_a_node_runs_engines()
    if args.channel_rtt is not None:
        channel_round_trips(rounds=20, trips=25, request_bytes=16384, answer_bytes=args.channel_rtt)
        return 0

    path, spec = gguf_path(args.models_dir, args.tiny)
    card = card_for(spec)
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(args.prompt_words))
    requests = [TextGenerationParams(model_id=card.model_id, prompt=f"{n} {prompt}", max_tokens=args.tokens,
                                     temperature=0) for n in range(args.requests + 1)]
    print(f"model {path} ({path.stat().st_size / 1e6:.0f} MB, {spec.num_layers} layers); "
          f"{args.requests} requests x {args.tokens} tokens; threads {args.threads}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    bins = args.llama_bin_dir
    openers = [("one node", lambda: open_engine(card, path, args.threads, "one")),
               ("skulk pool", lambda: open_engine(card, path, args.threads, "pool")),
               ("skulk pool, plain", lambda: open_engine(card, path, args.threads, "pool-plain")),
               ("direct RPC", lambda: open_engine(card, path, args.threads, "direct"))]
    if (bins / "ggml-rpc-server").is_file() and (bins / "llama-server").is_file():
        openers += [
            ("llama.cpp RPC", lambda: open_llama_server(card, path, args.threads, bins)),
            ("llama-server alone", lambda: open_llama_server(card, path, args.threads, bins, donor=None)),
        ]
        if args.stages:
            openers += [
                ("ours->ggml-rpc", lambda: open_engine(card, path, args.threads, "direct-ggml", bin_dir=bins)),
                ("l.cpp->our donor", lambda: open_llama_server(card, path, args.threads, bins, donor="lib")),
                ("l.cpp->chan plain", lambda: open_llama_server(card, path, args.threads, bins,
                                                                donor="ggml+channel-plain")),
                ("l.cpp->chan", lambda: open_llama_server(card, path, args.threads, bins, donor="ggml+channel")),
                ("llama.cpp RPC, THP", lambda: open_llama_server(card, path, args.threads, bins, huge_pages=True)),
                ("ours->chan", lambda: open_engine(card, path, args.threads, "ggml+channel", bin_dir=bins)),
            ]
    else:
        print(f"no ggml-rpc-server/llama-server under {args.llama_bin_dir}: llama.cpp's own RPC not measured")
    if args.stages:
        # Where the in-process driver's loss comes from: the same driver and encrypted
        # channel with the driver-side link as threads of the driver's process vs in a
        # process of its own; flash attention off (llama-server resolves `auto`); a 0.5 ms
        # GIL switch interval instead of CPython's 5 ms while the row decodes; the headline
        # row once more, loaded last (the spread between the two is the run's own noise).
        openers += [
            ("link as threads", lambda: open_engine(card, path, args.threads, "pool-link-thread")),
            ("link as process", lambda: open_engine(card, path, args.threads, "pool-link-process")),
            ("skulk pool FA off", lambda: open_engine(card, path, args.threads, "pool",
                                                       env={"SKULK_LLAMA_CPP_FLASH_ATTN": "0"})),
            ("direct RPC FA off", lambda: open_engine(card, path, args.threads, "direct",
                                                       env={"SKULK_LLAMA_CPP_FLASH_ATTN": "0"})),
            ("skulk pool sw 0.5ms", lambda: open_engine(card, path, args.threads, "pool", switch_interval=0.0005)),
            ("skulk pool again", lambda: open_engine(card, path, args.threads, "pool")),
        ]
    if args.only:
        by_name = dict(openers)
        wanted = [name.strip() for name in args.only.split(";") if name.strip()]
        if "one node" not in wanted:
            wanted.insert(0, "one node")
        openers = [(name, by_name[name]) for name in wanted if name in by_name]
    configs: dict[str, Config] = {}
    try:
        for name, opener in openers:
            try:
                configs[name] = opener()
            except Exception as exc:  # one configuration's failure is reported, the others still run
                print(f"{name}: FAILED to load: {exc}", flush=True)
                continue
            print(f"{name}: loaded in {configs[name].load_s:.1f} s {configs[name].note}", flush=True)
            _one_request(configs[name].stream, requests[0])  # warms caches; not counted
        # Round-robin: every configuration decodes request n before any decodes n + 1, so a
        # shared machine's load drifts over all of them alike; each round starts one
        # configuration later, so none always runs right after the same neighbour.
        results: dict[str, list] = {name: [] for name in configs}
        names = list(configs)
        for n, params in enumerate(requests[1:]):
            for name in names[n % len(names):] + names[: n % len(names)]:
                results[name].append(_one_request(configs[name].stream, params))
    finally:
        for config in configs.values():
            config.close()
    rows = {
        name: {"tokens": [r[0] for r in runs], "ttft_ms": statistics.median(r[1] for r in runs) * 1000,
               "tok_s": statistics.median(r[2] for r in runs if r[2]), "load_s": configs[name].load_s,
               "fast_tok_s": _fast_rate([g for r in runs for g in r[3]])}
        for name, runs in results.items()
    }
    base = rows.get("one node")
    if base is None:
        return 1
    ref = rows.get("llama.cpp RPC")
    print(f"\nload average now {os.getloadavg()[0]:.2f}")
    print(f"{'config':<20}{'tok/s':>8}{'x llama.cpp RPC':>17}{'x one node':>12}{'p10 tok/s':>11}{'x l.cpp':>9}"
          f"{'TTFT ms':>9}{'load s':>8}{'same tokens':>13}")
    for name, row in rows.items():
        same = row["tokens"] == base["tokens"]
        vs_ref = f"{row['tok_s'] / ref['tok_s']:.2f}" if ref else "-"
        fast_ref = f"{row['fast_tok_s'] / ref['fast_tok_s']:.2f}" if ref else "-"
        print(f"{name:<20}{row['tok_s']:>8.2f}{vs_ref:>17}{row['tok_s'] / base['tok_s']:>12.2f}"
              f"{row['fast_tok_s']:>11.2f}{fast_ref:>9}"
              f"{row['ttft_ms']:>9.0f}{row['load_s']:>8.1f}{'yes' if same else 'NO':>13}")
    if "skulk pool" in rows and "skulk pool, plain" in rows:
        cost = 1 - rows["skulk pool"]["tok_s"] / rows["skulk pool, plain"]["tok_s"]
        print(f"encryption cost on pooled decode: {cost:+.1%} (SKULK_POOL_ENCRYPT=0 turns it off)")
    if args.cache_loads:
        cache = tempfile.mkdtemp(prefix="pool-tensor-cache-")
        loads = {}
        try:
            for label in ("cold (fills the cache)", "warm (hashes only)"):
                config = open_engine(card, path, args.threads, "pool", cache)
                loads[label] = config.load_s
                config.close()
            cached_mb = sum(f.stat().st_size for f in Path(cache).iterdir()) / 1e6
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        loads_text = ", ".join(f"{k} {v:.1f} s" for k, v in loads.items())
        print(f"pool load with SKULK_POOL_TENSOR_CACHE_DIR: no cache {rows['skulk pool']['load_s']:.1f} s, "
              f"{loads_text}; {cached_mb:.0f} MB of the donor's share cached (not re-sent when warm)")
    if "skulk pool" in rows and "direct RPC" in rows:
        cost = 1 - rows["skulk pool"]["tok_s"] / rows["direct RPC"]["tok_s"]
        print(f"whole channel cost on pooled decode (vs the same driver with no channel): {cost:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
