"""Settings that decide how open a node is: where the cluster key comes from, the warnings
at start, and the environment's overrides of the `api` section."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.api.node_access import access_policy, access_warnings, with_api_key
from skulk.cli import key_on_command_line
from skulk.datadir.config import ConfigError, SkulkConfig, with_env_overrides
from skulk.datadir.paths import SkulkPaths
from skulk.node_settings import NodeSettings
from skulk.routing.cluster_key import ClusterKeyError, derive_peer_token, resolve_cluster_key


@pytest.mark.parametrize(
    ("argv", "visible"),
    [
        (["run", "--cluster-key", "k"], True),
        (["run", "--cluster-key=k"], True),
        (["run", "--cluster-key-file", "/etc/skulk/key"], False),
        (["run"], False),
    ],
)
def test_a_key_typed_on_the_command_line_is_noticed(argv, visible):
    assert key_on_command_line(argv) is visible


def test_the_cluster_key_can_come_from_a_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("  from-a-file \n")
    key_file.chmod(0o600)
    assert resolve_cluster_key(None, tmp_path / "data", key_file) == "from-a-file"
    assert resolve_cluster_key("explicit", tmp_path / "data", key_file) == "explicit"
    assert not (tmp_path / "data" / "cluster.key").exists()  # a file given is never replaced by a fresh key
    key_file.write_text("\n")
    with pytest.raises(ClusterKeyError, match="empty"):
        resolve_cluster_key(None, tmp_path / "data", key_file)
    with pytest.raises(ClusterKeyError):
        resolve_cluster_key(None, tmp_path / "data", tmp_path / "absent")


def test_the_peer_token_is_derived_and_reveals_nothing():
    token = derive_peer_token("cluster-secret")
    assert token == derive_peer_token(" cluster-secret\n")
    assert token != derive_peer_token("other-secret")
    assert "cluster-secret" not in token


def _settings(tmp_path: Path, **overrides) -> NodeSettings:
    paths = SkulkPaths(data_home=tmp_path, models_dir=tmp_path / "models", cache_home=tmp_path / "cache",
                       custom_cards_dir=tmp_path / "cards")
    return NodeSettings(paths=paths, node_name="n", **overrides)


def test_a_node_without_a_configured_key_creates_one_once(tmp_path):
    first = with_api_key(_settings(tmp_path))
    assert first.api_key and (tmp_path / "api.key").stat().st_mode & 0o077 == 0
    assert with_api_key(_settings(tmp_path)).api_key == first.api_key
    assert with_api_key(_settings(tmp_path, api_key="mine")).api_key == "mine"
    assert access_policy(first, "peer").api_key == first.api_key


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ({}, []),
        ({"open_to_lan": True}, ["open_to_lan"]),
        ({"open_to_lan": True, "api_host": "127.0.0.1"}, []),
        ({"allowed_hosts": ("*",)}, ["DNS rebinding"]),
    ],
)
def test_start_warnings(tmp_path, overrides, warned):
    warnings = access_warnings(_settings(tmp_path, **overrides))
    assert len(warnings) == len(warned)
    for warning, word in zip(warnings, warned, strict=True):
        assert word in warning


@pytest.mark.parametrize(
    ("env", "section", "key", "value"),
    [
        ({"SKULK_OPERATOR_KEY": "op"}, "api", "operator_key", "op"),
        ({"SKULK_API_REQUIRE_KEY_ON_LOOPBACK": "1"}, "api", "require_key_on_loopback", True),
        ({"SKULK_API_OPEN_TO_LAN": "false"}, "api", "open_to_lan", False),
        ({"SKULK_ALLOWED_HOSTS": "a.example, b.example"}, "api", "allowed_hosts", ["a.example", "b.example"]),
        ({"SKULK_MODELS_LOCAL_DIRS": "/srv/a:/srv/b"}, "models", "local_dirs", ["/srv/a", "/srv/b"]),
        ({"SKULK_DISK_RESERVE_GB": "2.5"}, "model_store", "disk_reserve_gb", 2.5),
    ],
)
def test_env_overrides(env, section, key, value):
    assert getattr(getattr(with_env_overrides(SkulkConfig(), env), section), key) == value


@pytest.mark.parametrize("env", [{"SKULK_API_OPEN_TO_LAN": "maybe"}, {"SKULK_DISK_RESERVE_GB": "-1"}])
def test_malformed_env_overrides_are_named(env):
    with pytest.raises(ConfigError, match=next(iter(env))):
        with_env_overrides(SkulkConfig(), env)
