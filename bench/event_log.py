"""Event log throughput against raw msgpack file I/O, measured in one run.

    uv run python bench/event_log.py [--events N] [--rotate-mib M]

Builds records shaped like an IndexedEvent's wire form (a nested event of ~10 fields),
then measures, in a temporary directory:
- log append: DiskEventLog.append for every record (per-record write + flush, rotation and
  zstd compression included, plus the final close), in two sessions (90 % / 10 %) so the
  replay below reads archives *and* a live file after a reopen;
- log replay: read_range(0) over the reopened log;
- raw write / raw read: the same records msgpack-packed into one plain buffered file, and
  unpacked back. This is the reference ceiling, not a competitor: it neither flushes per
  record nor compresses.
Prints each figure and the ratios. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import uuid
from pathlib import Path

import msgpack

from skulk.datadir.event_log import DiskEventLog

EVENT_KINDS = ("InstanceCreated", "RunnerStatusUpdated", "NodeGatheredInfo", "TaskCreated", "ChunkGenerated")
MODELS = ("local/tiny-llama", "local/tiny-llama-gguf", "mlx-community/Qwen3-8B-4bit")


def make_records(count: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    nodes = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(4)]
    records = []
    for idx in range(count):
        records.append(
            {
                "idx": idx,
                "origin": rng.choice(nodes),
                "indexedAt": f"2026-01-01T00:{idx // 60 % 60:02d}:{idx % 60:02d}.{idx % 1000:03d}Z",
                "event": {
                    "type": EVENT_KINDS[idx % len(EVENT_KINDS)],
                    "eventId": str(uuid.UUID(int=rng.getrandbits(128))),
                    "instanceId": str(uuid.UUID(int=rng.getrandbits(128))),
                    "runnerId": str(uuid.UUID(int=rng.getrandbits(128))),
                    "nodeId": rng.choice(nodes),
                    "modelId": rng.choice(MODELS),
                    "shardIndex": idx % 4,
                    "worldSize": 4,
                    "memoryBytes": rng.randrange(1 << 30, 64 << 30),
                    "status": rng.choice(("loading", "ready", "running", "failed")),
                    "params": {"contextLength": 8192, "temperature": 0.7, "backend": "mlx"},
                },
            }
        )
    return records


def rate(count: int, nbytes: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} events/s  {nbytes / seconds / 1e6:>8.1f} MB/s  ({seconds:.3f} s)"


def bench_log(directory: Path, records: list[dict], rotate_bytes: int) -> tuple[float, float, dict, int]:
    split = len(records) * 9 // 10
    kwargs = {"rotate_bytes": rotate_bytes, "free_space_floor_bytes": 0}

    started = time.perf_counter()
    log = DiskEventLog(directory, **kwargs)
    for record in records[:split]:
        log.append(record)
    log.close()
    log = DiskEventLog(directory, **kwargs)
    for record in records[split:]:
        log.append(record)
    append_s = time.perf_counter() - started
    stats = log.stats()

    started = time.perf_counter()
    replayed = 0
    for _ in log.read_range(0):
        replayed += 1
    replay_s = time.perf_counter() - started
    log.close()
    return append_s, replay_s, stats, replayed


def bench_raw(path: Path, records: list[dict]) -> tuple[float, float, int]:
    started = time.perf_counter()
    packer = msgpack.Packer(use_bin_type=True)
    with open(path, "wb") as fh:
        for record in records:
            fh.write(packer.pack(record))
    write_s = time.perf_counter() - started

    started = time.perf_counter()
    count = 0
    with open(path, "rb") as fh:
        for _ in msgpack.Unpacker(fh, raw=False):
            count += 1
    read_s = time.perf_counter() - started
    assert count == len(records)
    return write_s, read_s, path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rotate-mib", type=float, default=8.0, help="rotation size, small enough to make archives")
    args = parser.parse_args()

    records = make_records(args.events)
    payload_bytes = sum(len(msgpack.packb(r, use_bin_type=True)) for r in records)
    print(f"{args.events:,} records, {payload_bytes / args.events:.0f} B packed on average, "
          f"{payload_bytes / 1e6:.1f} MB in all; rotate at {args.rotate_mib} MiB")

    with tempfile.TemporaryDirectory(prefix="skulk-bench-") as tmp:
        tmp_path = Path(tmp)
        raw_write_s, raw_read_s, raw_bytes = bench_raw(tmp_path / "raw.msgpack", records)
        append_s, replay_s, stats, replayed = bench_log(tmp_path / "log", records, int(args.rotate_mib * (1 << 20)))
        on_disk = stats["archive_bytes"] + stats["live_bytes"]

    log_bytes = payload_bytes + 4 * args.events
    print(f"raw write      {rate(args.events, raw_bytes, raw_write_s)}")
    print(f"log append     {rate(args.events, log_bytes, append_s)}")
    print(f"raw read       {rate(args.events, raw_bytes, raw_read_s)}")
    print(f"log replay     {rate(replayed, log_bytes, replay_s)}"
          f"  [{stats['archive_count']} archives + {stats['live_bytes'] / 1e6:.1f} MB live]")
    print(f"on disk        {on_disk / 1e6:.1f} MB for {log_bytes / 1e6:.1f} MB of frames "
          f"({log_bytes / max(on_disk, 1):.1f}x smaller)")
    print(f"ratio  log append / raw write  = {raw_write_s / append_s:.2f}  (throughput; 1.0 = as fast as raw)")
    print(f"ratio  log replay / raw read   = {raw_read_s / replay_s:.2f}  (throughput)")
    if replayed != args.events:
        print(f"WARNING: replay returned {replayed} of {args.events} records")


if __name__ == "__main__":
    main()
