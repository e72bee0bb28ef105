"""The pool's engine halves refuse clearly instead of hanging or guessing."""

from __future__ import annotations

import pytest

from skulk.pool.layout import derive_pool_key
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.worker.engines.base import ModelLoadFailed, ShardSpec
from skulk.worker.engines.llama_cpp import pool as llama_pool
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine
from tests.worker.tiny_gguf import tiny_gguf, tiny_gguf_card  # noqa: F401


def pooled(hosts: list[str]) -> Instance:
    return Instance(
        instance_id="pool-unit", model_id="local/tiny-llama-gguf", sharding="Pipeline", context_token_limit=512,
        ring_hosts=hosts,
        shards=[ShardAssignment(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=2, start_layer=3 * r,
                                end_layer=3 * r + 3, backend="llama_cpp-cpu") for r in range(2)],
    )


def test_a_driver_whose_donor_never_answers_fails_its_load_naming_the_node(tiny_gguf, monkeypatch):
    monkeypatch.setattr(llama_pool, "DONOR_CONNECT_DEADLINE_S", 0.5)
    spec = ShardSpec(instance=pooled(["127.0.0.1", "127.0.0.1"]), runner_id="r0", card=tiny_gguf_card(),
                     model_path=str(tiny_gguf), n_threads=1, pool_key=derive_pool_key("k"))
    with pytest.raises(ModelLoadFailed, match=r"node n1 \(rank 1\)"):
        LlamaCppEngine().load(spec)


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
