"""Where a streamed token's CPU goes on one Skulk node: the runner (llama.cpp decoding), the
node process (supervisor, data plane, API, SSE), and this client, per streamed token.

The serving path's cost is the node's share: on a machine whose cores all decode, every
millisecond the node spends per token is taken from a decode thread (bench/serve.py shows the
effect as the skulk/engine ratio). The node's share is also split per thread, so a regression
shows where it landed (thread names are the kernel's; the event loop is the main thread).

Usage:
  uv run python bench/node_overhead.py [--spec bench|tiny] [--tokens 256] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def thread_cpu_s(process: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", choices=sorted(serve.SPECS), default="bench")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    spec = serve.SPECS[args.spec]
    gguf = serve.ensure_bench_model(None, spec)
    with tempfile.TemporaryDirectory(prefix="skulk-node-overhead-") as tmp:
        node = serve.start_skulk(Path(tmp), gguf, True, spec)
        try:
            serve.place_on_skulk(node)
            server = serve.ChatServer("skulk", node.url, serve.MODEL_ID, [])
            server.stream("warm up", 16)
            parent, me = psutil.Process(node.proc.pid), psutil.Process()
            main_tid = node.proc.pid
            rows = []
            for rep in range(args.reps):
                runners = parent.children(recursive=True)
                before = (cpu_s(parent), sum(cpu_s(r) for r in runners), cpu_s(me), thread_cpu_s(parent))
                stream = server.stream(f"Request {rep}: write a long story", args.tokens)
                after = (cpu_s(parent), sum(cpu_s(r) for r in runners), cpu_s(me), thread_cpu_s(parent))
                n = len(stream.arrivals)
                main_ms = (after[3].get(main_tid, 0.0) - before[3].get(main_tid, 0.0)) / n * 1e3
                row = ((after[0] - before[0]) / n * 1e3, main_ms, (after[1] - before[1]) / n * 1e3,
                       (after[2] - before[2]) / n * 1e3, stream.decode_tok_s)
                rows.append(row)
                print(f"rep {rep}: {n} tokens, {row[4]:.1f} tok/s; CPU ms/token: node {row[0]:.3f} "
                      f"(event loop {row[1]:.3f}), runner {row[2]:.2f}, client {row[3]:.3f}", flush=True)
            idle_before = cpu_s(parent)
            time.sleep(3.0)
            idle_ms_s = (cpu_s(parent) - idle_before) / 3.0 * 1e3
            med = [statistics.median(col) for col in zip(*rows, strict=True)]
            print(f"median: node {med[0]:.3f} ms/token (event loop {med[1]:.3f}), runner {med[2]:.2f}, "
                  f"client {med[3]:.3f}, {med[4]:.1f} tok/s; idle node {idle_ms_s:.1f} ms CPU per second")
        finally:
            node.stop()


if __name__ == "__main__":
    main()
