from pathlib import Path

import pytest

from skulk.cli import RunFlags, parse_duration, resolve_settings
from skulk.datadir.config import parse_config
from skulk.datadir.paths import resolve_paths

PATHS = resolve_paths({"SKULK_HOME": "/h"}, "linux", Path("/home/x"))


def test_defaults():
    s = resolve_settings(RunFlags(), parse_config("", Path("c")), PATHS, "host1")
    assert (s.api_port, s.node_name, s.multicast, s.api_enabled, s.worker_enabled) == (52415, "host1", True, True, True)
    assert s.listen == () and s.bootstrap_peers == ()


def test_config_over_defaults_and_flags_over_config():
    config = parse_config(
        "node:\n  name: cfg\n  api_port: 6000\n  bootstrap_peers: [tcp/1.2.3.4:7447]\n  multicast: true\n", Path("c")
    )
    s = resolve_settings(RunFlags(), config, PATHS, "host1")
    assert (s.api_port, s.node_name, s.bootstrap_peers) == (6000, "cfg", ("tcp/1.2.3.4:7447",))
    s = resolve_settings(
        RunFlags(api_port=7000, node_name="flag", bootstrap_peers="tcp/a:1, tcp/b:2", no_multicast=True,
                 no_api=True, no_worker=True, listen="tcp/127.0.0.1:9"),
        config, PATHS, "host1",
    )
    assert (s.api_port, s.node_name, s.bootstrap_peers, s.multicast) == (7000, "flag", ("tcp/a:1", "tcp/b:2"), False)
    assert s.listen == ("tcp/127.0.0.1:9",) and not s.api_enabled and not s.worker_enabled
    assert s.api_endpoint is None


def test_config_can_turn_multicast_off():
    s = resolve_settings(RunFlags(), parse_config("node:\n  multicast: false\n", Path("c")), PATHS, "h")
    assert not s.multicast


def test_api_key_from_env_beats_config():
    config = parse_config("api:\n  api_key: from-config\n", Path("c"))
    assert resolve_settings(RunFlags(), config, PATHS, "h").api_key == "from-config"
    assert resolve_settings(RunFlags(), config, PATHS, "h", "from-env").api_key == "from-env"
    assert resolve_settings(RunFlags(), parse_config("", Path("c")), PATHS, "h").api_key is None


def test_model_store_section_reaches_the_node_settings():
    config = parse_config("model_store:\n  store_host: 10.0.0.9:52415\n  staging_keep_recent_gb: 5\n", Path("c"))
    s = resolve_settings(RunFlags(), config, PATHS, "h")
    assert s.model_store.store_host == "10.0.0.9:52415" and s.model_store.staging_keep_recent_gb == 5
    assert resolve_settings(RunFlags(), parse_config("", Path("c")), PATHS, "h").model_store.store_host is None


def test_joined_peers_come_after_flags_and_config():
    joined = ("tcp/10.0.0.5:7447",)
    empty = parse_config("", Path("c"))
    assert resolve_settings(RunFlags(), empty, PATHS, "h", joined_peers=joined).bootstrap_peers == joined
    config = parse_config("node:\n  bootstrap_peers: [tcp/cfg:1]\n", Path("c"))
    assert resolve_settings(RunFlags(), config, PATHS, "h", joined_peers=joined).bootstrap_peers == ("tcp/cfg:1",)
    flags = RunFlags(bootstrap_peers="tcp/flag:1")
    assert resolve_settings(flags, empty, PATHS, "h", joined_peers=joined).bootstrap_peers == ("tcp/flag:1",)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0),
                                               (" 1.5M ", 90.0)])
def test_invite_expiry_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "-5m", "0", "soon", "5d"])
def test_bad_invite_expiry_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)
