"""The remembered store: the master's store survives a restart and fills the startup window,
below an explicit setting and a live master, above bootstrapping."""

from __future__ import annotations

import pytest

from skulk.datadir.config import ModelStoreSection
from skulk.datadir.paths import SkulkPaths
from skulk.model_store.host import StoreAddress, choose_store
from skulk.model_store.memory import STORE_MEMORY_FILE, load_remembered_store, remember_store
from skulk.model_store.node_store import bind_store

OWN = StoreAddress("10.0.0.1", 52415)
MASTER = StoreAddress("10.0.0.2", 52415)
OLD = StoreAddress("10.0.0.3", 52415, "https")
EXPLICIT = StoreAddress("10.0.0.9", 6000)


@pytest.mark.parametrize(
    ("explicit", "master", "remembered", "address", "source", "is_self"),
    [
        (None, None, None, OWN, "bootstrap", True),
        (None, None, OLD, OLD, "remembered", False),
        (None, None, OWN, OWN, "remembered", True),  # it was the master's store itself
        (None, MASTER, OLD, MASTER, "master", False),
        (EXPLICIT, MASTER, OLD, EXPLICIT, "explicit", False),
    ],
)
def test_choose_store_with_a_remembered_store(explicit, master, remembered, address, source, is_self):
    choice = choose_store(explicit, master, OWN, remembered=remembered)
    assert (choice.address, choice.source, choice.is_self) == (address, source, is_self)


def test_a_node_without_an_api_follows_the_remembered_store(tmp_path):
    paths = SkulkPaths(data_home=tmp_path, models_dir=tmp_path / "models", cache_home=tmp_path / "cache",
                       custom_cards_dir=tmp_path / "cards")
    binding = bind_store(paths, ModelStoreSection(), explicit=None, master_endpoint=None, own=None, remembered=OLD)
    assert binding is not None and (binding.choice.address, binding.choice.source) == (OLD, "remembered")
    assert binding.store.canonical_root is None
    assert bind_store(paths, ModelStoreSection(), explicit=None, master_endpoint=None, own=None) is None


def test_remember_and_load_round_trip(tmp_path):
    assert load_remembered_store(tmp_path) is None
    remember_store(tmp_path, OLD)
    assert load_remembered_store(tmp_path) == OLD
    remember_store(tmp_path, MASTER)
    assert load_remembered_store(tmp_path) == MASTER
    assert [p.name for p in tmp_path.iterdir()] == [STORE_MEMORY_FILE]  # no temp files left behind


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"host": "h"}', '{"host": "h", "port": "80"}', '{"host": "h", "port": 0}',
     '{"host": "", "port": 80}', '{"host": "h", "port": 80, "scheme": "ftp"}'],
)
def test_a_malformed_memory_is_ignored(tmp_path, text):
    (tmp_path / STORE_MEMORY_FILE).write_text(text)
    assert load_remembered_store(tmp_path) is None


def test_the_node_uses_its_remembered_store_only_until_a_master_speaks(tmp_path, monkeypatch):
    """The node's shell: remembered store in the startup window, the master's once heard
    (and persisted), never the remembered one again this session."""
    from skulk.node import Node
    from skulk.node_settings import NodeSettings

    paths = SkulkPaths(data_home=tmp_path, models_dir=tmp_path / "models", cache_home=tmp_path / "cache",
                       custom_cards_dir=tmp_path / "cards")
    node = Node(NodeSettings(paths=paths, node_name="n"))
    node._own_store, node._remembered_store = OWN, OLD
    master: list[str | None] = [None]
    monkeypatch.setattr(node, "_master_api_endpoint", lambda: master[0])

    assert node.store_binding().choice.source == "remembered"
    assert load_remembered_store(tmp_path) is None  # nothing new to persist yet
    master[0] = "http://10.0.0.2:52415"
    choice = node.store_binding().choice
    assert (choice.address, choice.source) == (MASTER, "master")
    assert load_remembered_store(tmp_path) == MASTER
    master[0] = None  # the master is lost: bootstrap, not the stale memory
    assert node.store_binding().choice.source == "bootstrap"
