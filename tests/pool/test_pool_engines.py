"""The pool's engine halves refuse clearly instead of hanging or guessing."""

from __future__ import annotations

import socket
import sys
import uuid

import pytest

from skulk.pool.channel import DonorGate
from skulk.pool.layout import channel_key, derive_pool_key, pool_port
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.worker.engines.base import ModelLoadFailed, ShardSpec
from skulk.worker.engines.llama_cpp import pool as llama_pool
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine
from tests.worker.tiny_gguf import tiny_gguf, tiny_gguf_card  # noqa: F401


def pooled(hosts: list[str], instance_id: str = "pool-unit") -> Instance:
    return Instance(
        instance_id=instance_id, model_id="local/tiny-llama-gguf", sharding="Pipeline", context_token_limit=512,
        ring_hosts=hosts,
        shards=[ShardAssignment(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=2, start_layer=3 * r,
                                end_layer=3 * r + 3, backend="llama_cpp-cpu") for r in range(2)],
    )


def test_a_driver_whose_donor_never_answers_fails_its_load_naming_the_node(tiny_gguf, monkeypatch):
    monkeypatch.setattr(llama_pool, "DONOR_CONNECT_DEADLINE_S", 0.5)
    spec = ShardSpec(instance=pooled(["127.0.0.1", "127.0.0.1"]), runner_id="r0", card=tiny_gguf_card(),
                     model_path=str(tiny_gguf), n_threads=1, pool_key=derive_pool_key("k"))
    before = sys.getswitchinterval()
    with pytest.raises(ModelLoadFailed, match=r"node n1 \(rank 1\)"):
        LlamaCppEngine().load(spec)
    assert sys.getswitchinterval() == before  # a failed load leaves the process as it found it


def test_a_driver_shortens_the_gil_switch_interval_while_it_drives_and_restores_it():
    """The driver's relay threads share the runner's GIL with the token loop; while a pool is
    driven the process switches threads at RELAY_SWITCH_INTERVAL_S (bench/pool.py measures
    why), and closing the driver gives the process its own interval back."""
    key = derive_pool_key("k")
    instance = pooled(["127.0.0.1", "127.0.0.1"], instance_id=f"pool-unit-{uuid.uuid4().hex[:8]}")
    with socket.create_server(("127.0.0.1", 0)) as rpc_stand_in:  # the gate relays to it; nothing is sent
        gate = DonorGate("127.0.0.1", pool_port(instance, 1), channel_key(key, instance, 1),
                         rpc_stand_in.getsockname()[1])
        gate.start()
        try:
            spec = ShardSpec(instance=instance, runner_id="r0", card=tiny_gguf_card(), model_path="unused.gguf",
                             n_threads=1, pool_key=key)
            before = sys.getswitchinterval()
            driver = llama_pool.PoolDriver(spec, lambda kind, message: None)
            driver.connect()  # every donor's gate accepted it
            try:
                assert sys.getswitchinterval() == pytest.approx(min(before, llama_pool.RELAY_SWITCH_INTERVAL_S))
            finally:
                driver.close()
            assert sys.getswitchinterval() == before
        finally:
            gate.close()


@pytest.mark.parametrize("engine", [LlamaCppEngine, llama_pool.PoolDonorEngine])
def test_a_pool_rank_without_the_pool_key_refuses_to_load(tiny_gguf, engine):
    runner = "r0" if engine is LlamaCppEngine else "r1"
    spec = ShardSpec(instance=pooled(["127.0.0.1", "127.0.0.1"]), runner_id=runner, card=tiny_gguf_card(),
                     model_path=str(tiny_gguf), n_threads=1)
    with pytest.raises(ModelLoadFailed, match="pool key"):
        engine().load(spec)


def test_a_pool_across_nodes_without_addresses_is_refused(tiny_gguf):
    spec = ShardSpec(instance=pooled([]), runner_id="r1", card=tiny_gguf_card(), model_path=str(tiny_gguf),
                     n_threads=1, pool_key=derive_pool_key("k"))
    with pytest.raises(ModelLoadFailed, match="no addresses"):
        llama_pool.PoolDonorEngine().load(spec)
