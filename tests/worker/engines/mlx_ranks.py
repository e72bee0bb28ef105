"""Real MLX rank processes for the engine's multi-rank tests and bench/shard.py.

Each rank is a `multiprocessing` spawn child that loads its shard with `MlxEngine`, exactly as
a runner would; rank 0 then runs the requests it was given and reports tokens, timings and
bytes sent; followers serve until rank 0 closes the group. Children are module-level
functions so spawn can import them.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import Sharding
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.kv_cache import KvCacheType
from skulk.shared.types.tasks import TextGenerationParams

NODE = NodeId("node-local")


def free_ports(n: int) -> list[int]:
    """Ports the kernel just handed out (held together, so they are distinct)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def layer_split(num_layers: int, world: int) -> list[tuple[int, int]]:
    base, extra = divmod(num_layers, world)
    out, start = [], 0
    for rank in range(world):
        end = start + base + (1 if rank < extra else 0)
        out.append((start, end))
        start = end
    return out


def local_instance(
    card: ModelCard, world: int, sharding: Sharding = "Pipeline", *, ports: Sequence[int] | None = None,
    instance_id: str = "instance-mlx", kv_cache_type: KvCacheType = "f16",
) -> Instance:
    """A `world`-rank instance on one node; ranks on loopback at `ports` (fresh if None),
    every shard stamped with `kv_cache_type`."""
    ranges = [(0, card.num_layers)] * world if sharding == "Tensor" else layer_split(card.num_layers, world)
    ports = list(ports) if ports is not None else free_ports(world)
    return Instance(
        instance_id=InstanceId(instance_id),
        model_id=ModelId(card.model_id),
        sharding=sharding,
        shards=[
            ShardAssignment(
                node_id=NODE, runner_id=RunnerId(f"runner-{rank}"), rank=rank, world_size=world,
                start_layer=start, end_layer=end, backend="mlx-cpu", kv_cache_type=kv_cache_type,
            )
            for rank, (start, end) in enumerate(ranges)
        ],
        context_token_limit=card.context_length,
        ring_hosts=[f"127.0.0.1:{p}" for p in ports] if world > 1 else [],
    )


@dataclass
class RankReport:
    rank: int
    ok: bool
    tokens: list[list[int]] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    bytes_sent: int = 0
    error: str = ""


def rank_main(instance_json: str, rank: int, card_json: str, model_path: str,
              requests_json: list[str], reports: Any, env: dict[str, str]) -> None:
    """Spawn target: load this rank's shard, serve, report."""
    import os

    os.environ.update(env)
    from skulk.worker.engines.base import ShardSpec
    from skulk.worker.engines.mlx.engine import MlxEngine

    instance = Instance.model_validate_json(instance_json)
    card = ModelCard.model_validate_json(card_json)
    report = RankReport(rank=rank, ok=False)
    engine = MlxEngine()
    try:
        engine.load(ShardSpec(instance=instance, runner_id=instance.shards[rank].runner_id, card=card,
                              model_path=model_path, n_threads=1))
        engine.warm_up()
        if rank == 0:
            engine.bytes_sent = 0
            for raw in requests_json:
                params = TextGenerationParams.model_validate_json(raw)
                started = time.perf_counter()
                first: float | None = None
                ids: list[int] = []
                for token in engine.generate(params, threading.Event()):
                    if first is None:
                        first = time.perf_counter()
                    ids.append(token.token_id if token.token_id is not None else -1)
                end = time.perf_counter()
                report.tokens.append(ids)
                report.ttft_s.append((first or end) - started)
                report.decode_s.append(end - (first or end))
            report.bytes_sent = engine.bytes_sent
            engine.close()  # tells the followers to stop
        else:
            assert engine._follower is not None
            engine._follower.join(300)
            report.bytes_sent = engine.bytes_sent
        report.ok = True
    except BaseException:
        report.error = traceback.format_exc()
    reports.put(report)


def run_group(
    instance: Instance, card: ModelCard, model_path: Path, requests: Sequence[TextGenerationParams],
    *, timeout_s: float = 90.0, env: dict[str, str] | None = None, ranks: Sequence[int] | None = None,
) -> list[RankReport]:
    """Run the ranks of `instance` (all, or only `ranks`) as their own processes; returns
    their reports in rank order. Always reaps the processes, even on failure."""
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    launched = list(ranks) if ranks is not None else list(range(len(instance.shards)))
    world = len(launched)
    procs = [
        ctx.Process(
            target=rank_main,
            args=(instance.model_dump_json(), rank, card.model_dump_json(), str(model_path),
                  [r.model_dump_json() for r in requests], reports, env or {}),
            name=f"mlx-rank-{rank}",
            daemon=True,
        )
        for rank in launched
    ]
    for p in procs:
        p.start()
    got: dict[int, RankReport] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                report = reports.get(timeout=0.5)
            except Exception:
                if all(not p.is_alive() for p in procs) and reports.empty():
                    break
                continue
            got[report.rank] = report
    finally:
        for p in procs:
            p.join(max(0.1, min(5.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    for rank, p in zip(launched, procs, strict=True):
        got.setdefault(rank, RankReport(rank=rank, ok=False, error=f"no report (exit code {p.exitcode})"))
    return [got[r] for r in launched]


def tensor_logits_main(instance_json: str, rank: int, model_path: str, tokens: list[int], out: Any) -> None:
    """Spawn target: one tensor rank's last-token logits for `tokens` (no engine protocol:
    every rank runs the same forward, which is what tensor sharding must get right)."""
    try:
        import mlx.core as mx
        from mlx_lm.utils import load_config, load_model

        from skulk.worker.engines.mlx.family import family_of
        from skulk.worker.engines.mlx.group import form_group, ring_addresses
        from skulk.worker.engines.mlx.pipeline import build_stage, embed_tokens, forward_layers, last_logits, stage_role
        from skulk.worker.engines.mlx.tensor import shard_layers

        instance = Instance.model_validate_json(instance_json)
        path = Path(model_path)
        config = load_config(path)
        family = family_of(config["model_type"])
        shard = instance.shards[rank]
        role = stage_role(shard, instance.sharding, config["num_hidden_layers"])
        group = form_group(ring_addresses(instance), rank, 30.0) if shard.world_size > 1 else None
        model, _ = load_model(path, lazy=True)
        parts = family.parts(model)
        if role.tensor:
            shard_layers(parts.layers, family.tensor, group, config)
        stage = build_stage(parts, role)
        cache = stage.make_cache()
        logits = last_logits(stage, forward_layers(stage, embed_tokens(stage, mx.array(tokens)), cache))
        mx.eval(logits)
        out.put((rank, logits.tolist(), ""))
    except BaseException:
        out.put((rank, None, traceback.format_exc()))


def run_tensor_logits(instance: Instance, model_path: Path, tokens: list[int], timeout_s: float = 60.0):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=tensor_logits_main, args=(instance.model_dump_json(), r, str(model_path), tokens, out),
                    daemon=True)
        for r in range(len(instance.shards))
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) < len(procs) and time.monotonic() < deadline:
            try:
                rank, logits, error = out.get(timeout=0.5)
            except Exception:
                continue
            results[rank] = (logits, error)
    finally:
        for p in procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(5)
    return results


__all__ = [
    "RankReport",
    "free_ports",
    "layer_split",
    "local_instance",
    "run_group",
    "run_tensor_logits",
]
