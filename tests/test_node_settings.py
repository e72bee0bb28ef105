"""The node's effective settings as diagnostics and the dashboard show them."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.datadir.paths import SkulkPaths
from skulk.node_settings import NodeSettings, settings_wire

PATHS = SkulkPaths(data_home=Path("/d"), models_dir=Path("/d/models"), cache_home=Path("/c"),
                   custom_cards_dir=Path("/d/cards"))


@pytest.mark.parametrize(("api_key", "cluster_key"), [(None, None), ("sk-secret", "cluster-secret")])
def test_secrets_are_reported_as_set_never_shown(api_key, cluster_key):
    wire = settings_wire(NodeSettings(paths=PATHS, node_name="n", api_key=api_key, cluster_key=cluster_key,
                                      api_host="127.0.0.1", listen=("tcp/127.0.0.1:7447",)))
    assert wire["apiKeySet"] is bool(api_key) and wire["clusterKeyGiven"] is bool(cluster_key)
    assert "secret" not in repr(wire)
    assert wire["apiEndpoint"] == "http://127.0.0.1:52415" and wire["listen"] == ["tcp/127.0.0.1:7447"]
    assert wire["modelStore"]["diskReserveGb"] == 10.0 and wire["dataDir"] == "/d"


def test_a_node_without_an_api_has_no_endpoint():
    assert settings_wire(NodeSettings(paths=PATHS, node_name="n", api_enabled=False))["apiEndpoint"] is None
