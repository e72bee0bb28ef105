"""The pool's engine halves refuse clearly instead of hanging or guessing."""

from __future__ import annotations

import psutil
import pytest

from skulk.pool.layout import derive_pool_key
from skulk.provision.node_engine import POOL_RPC_SERVER_ENV
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.worker.engines.base import ModelLoadFailed, ShardSpec
from skulk.worker.engines.llama_cpp import pool as llama_pool
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine
from tests.llama_server_kit import require_native_rpc_server
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


def test_a_donor_lends_through_the_managed_rpc_server_and_stops_it(tiny_gguf, monkeypatch):
    # The node exported the managed build's ggml-rpc-server: the donor runs it as a child on
    # loopback (behind its gate) instead of llama-cpp-python's in-process CPU server, and
    # nothing of it outlives the engine.
    binary = require_native_rpc_server()
    monkeypatch.setenv(POOL_RPC_SERVER_ENV, str(binary))
    spec = ShardSpec(instance=pooled(["127.0.0.1", "127.0.0.1"]), runner_id="r1", card=tiny_gguf_card(),
                     model_path=str(tiny_gguf), n_threads=1, pool_key=derive_pool_key("k"))
    donor = llama_pool.PoolDonorEngine()
    donor.load(spec)
    try:
        servers = [c for c in psutil.Process().children() if c.name() == binary.name]
        assert len(servers) == 1
        listening = {(s.laddr.ip, s.laddr.port) for s in servers[0].net_connections(kind="tcp")
                     if s.status == psutil.CONN_LISTEN}
        assert listening == {("127.0.0.1", donor.rpc_port)}
    finally:
        donor.close()
    assert not servers[0].is_running() or servers[0].status() == psutil.STATUS_ZOMBIE


def test_a_missing_managed_rpc_server_fails_the_donor_load_by_name(tiny_gguf, monkeypatch, tmp_path):
    monkeypatch.setenv(POOL_RPC_SERVER_ENV, str(tmp_path / "ggml-rpc-server"))
    spec = ShardSpec(instance=pooled(["127.0.0.1", "127.0.0.1"]), runner_id="r1", card=tiny_gguf_card(),
                     model_path=str(tiny_gguf), n_threads=1, pool_key=derive_pool_key("k"))
    with pytest.raises(ModelLoadFailed, match=r"SKULK_POOL_RPC_SERVER_BIN.*missing"):
        llama_pool.PoolDonorEngine().load(spec)
