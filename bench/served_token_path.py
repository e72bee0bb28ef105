"""Where one streamed token's CPU goes inside a served engine's runner, stage by stage.

One real streaming /completion from the llama-server binary (the tiny GGUF, Skulk's own
launch line and request body) is recorded as raw bytes; then each stage the runner applies
per token is timed on those exact bytes, in this process, many times over:

  split    `served/sse.StreamResponse.lines`: chunked bytes -> SSE lines
  parse    the engine's `_event_of`: one line -> its JSON event (bytes decode + json.loads)
  tokens   `launch.tokens_of_event`: event -> GeneratedToken
  pack     `runner/messages.pack_token`: the runner -> supervisor frame bytes
  unpack   `runner/messages.unpack`: those bytes -> Frame, in the supervisor

CPU (process time) per event, median of --reps. What is not here: the pipe write and read
(one syscall each way), the node's relay and API encoding (bench/node_overhead.py), and the
server's own per-token cost (bench/concurrency.py's CPU table). A stage that costs a large
share of the server's per-token CPU (hundreds of microseconds on the tiny model) is worth
fixing; a few microseconds is not.

Usage: uv run python bench/served_token_path.py [--tokens 256] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llama_server_kit import find_llama_server
from tests.worker.tiny_gguf import LONG_PROMPT, prompt_params

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.worker.engines.served.launch import ServerLaunch, completion_body, server_env, tokens_of_event
from skulk.worker.engines.served.llama_server import _event_of
from skulk.worker.engines.served.process import ServerProcess, free_loopback_port
from skulk.worker.engines.served.sse import StreamResponse
from skulk.worker.runner.messages import pack_token, unpack


class _Recorded:
    """Stands in for an http.client response: the recorded body, in the chunks it came in."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.status = 200
        self._chunks = iter(chunks)

    def read1(self, _size: int) -> bytes:
        return next(self._chunks, b"")


def record(tokens: int) -> list[bytes]:
    """The raw body chunks of one streaming /completion, as the socket delivered them."""
    binary = find_llama_server()
    if binary is None:
        raise SystemExit("no llama-server: run `uv run skulk engines install --backend cpu`")
    card = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")
    gguf = Path(ensure_local_model(card, Path(tempfile.gettempdir()) / "skulk-bench-models"))
    port = free_loopback_port()
    server = ServerProcess(ServerLaunch(binary, gguf, port, 1, 1024, 1, 0, True).argv(), server_env(os.environ), port)
    try:
        server.wait_healthy()
        body = completion_body(prompt_params(LONG_PROMPT, temperature=0, max_tokens=tokens), LONG_PROMPT, None)
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{server.base_url}/completion", json=body) as r:
            return list(r.iter_raw())
    finally:
        server.stop()


def per_event_us(stage, events: int, reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.process_time()
        stage()
        samples.append((time.process_time() - start) / events * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    chunks = record(args.tokens)
    lines = list(StreamResponse(_Recorded(chunks)).lines())  # type: ignore[arg-type]
    data = [line for line in lines if line.startswith(b"data:")]
    events = [_event_of(line.decode("utf-8")) for line in data]
    generated = [t for e in events if e is not None for t in tokens_of_event(e, False, 0)]
    packed = [pack_token("node", "cmd", i, t.text, t.token_id, t.finish_reason, t.usage) for i, t in enumerate(generated)]
    n = len(data)
    print(f"{n} events in {len(chunks)} chunks, {sum(map(len, chunks)) / n:.0f} bytes/event; "
          f"load average {os.getloadavg()}")
    loops = 50  # each rep walks the recording this many times: milliseconds, not microseconds

    def split() -> None:
        for _ in range(loops):
            for _line in StreamResponse(_Recorded(chunks)).lines():  # type: ignore[arg-type]
                pass

    def parse() -> None:
        for _ in range(loops):
            for line in data:
                _event_of(line.decode("utf-8"))

    def tokens() -> None:
        for _ in range(loops):
            for event in events:
                if event is not None:
                    tokens_of_event(event, False, 0)

    def pack() -> None:
        for _ in range(loops):
            for i, t in enumerate(generated):
                pack_token("node", "cmd", i, t.text, t.token_id, t.finish_reason, t.usage)

    def unpack_all() -> None:
        for _ in range(loops):
            for blob in packed:
                unpack(blob)

    total = 0.0
    for name, stage in (("split", split), ("parse", parse), ("tokens", tokens), ("pack", pack), ("unpack", unpack_all)):
        us = per_event_us(stage, n * loops, args.reps)
        total += us
        print(f"{name:<7} {us:7.2f} us/event")
    print(f"{'total':<7} {total:7.2f} us/event (runner + supervisor, before pipe syscalls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
