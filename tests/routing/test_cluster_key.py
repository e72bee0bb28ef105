"""Cluster key: created once per data dir, explicit keys win, wire key bound to the network version."""

from __future__ import annotations

import os
import stat

import pytest

from skulk.routing.cluster_key import (
    CLUSTER_KEY_FILE,
    ClusterKeyError,
    derive_wire_key,
    load_or_create_cluster_key,
    resolve_cluster_key,
)
from skulk.routing.constants import NETWORK_VERSION


def test_first_start_creates_a_private_random_key_and_later_starts_read_it(tmp_path) -> None:
    data_dir = tmp_path / "node-home"
    key = load_or_create_cluster_key(data_dir)
    path = data_dir / CLUSTER_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) >= 40 and key.replace("-", "").replace("_", "").isalnum()
    assert load_or_create_cluster_key(data_dir) == key
    assert load_or_create_cluster_key(tmp_path / "other-home") != key


def test_operator_written_key_file_is_used_as_is(tmp_path) -> None:
    (tmp_path / CLUSTER_KEY_FILE).write_text("  our lab cluster, 2024 \n")
    os.chmod(tmp_path / CLUSTER_KEY_FILE, 0o600)
    assert load_or_create_cluster_key(tmp_path) == "our lab cluster, 2024"


def test_empty_key_file_is_an_error_not_a_new_cluster(tmp_path) -> None:
    (tmp_path / CLUSTER_KEY_FILE).write_text("\n")
    with pytest.raises(ClusterKeyError) as info:
        load_or_create_cluster_key(tmp_path)
    assert info.value.path == tmp_path / CLUSTER_KEY_FILE


def test_explicit_key_wins_and_does_not_touch_the_data_dir(tmp_path) -> None:
    assert resolve_cluster_key("from-env", tmp_path) == "from-env"
    assert not (tmp_path / CLUSTER_KEY_FILE).exists()


@pytest.mark.parametrize("explicit", [None, "", "   "])
def test_missing_explicit_key_falls_back_to_the_data_dir(tmp_path, explicit) -> None:
    stored = load_or_create_cluster_key(tmp_path)
    assert resolve_cluster_key(explicit, tmp_path) == stored


def test_wire_key_is_32_bytes_deterministic_and_separates_keys_and_versions() -> None:
    key = derive_wire_key("k", NETWORK_VERSION)
    assert len(key) == 32
    assert derive_wire_key("k", NETWORK_VERSION) == key
    assert derive_wire_key(" k\n", NETWORK_VERSION) == key
    assert derive_wire_key("k2", NETWORK_VERSION) != key
    assert derive_wire_key("k", NETWORK_VERSION + "-next") != key


def test_empty_cluster_key_cannot_derive_a_wire_key() -> None:
    with pytest.raises(ClusterKeyError):
        derive_wire_key("  ", NETWORK_VERSION)
