from pathlib import Path

import pytest

from skulk.datadir.config import ConfigError, SkulkConfig, load_config, parse_config

P = Path("/etc/skulk.yaml")


def test_missing_file_means_defaults(tmp_path):
    assert load_config(tmp_path / "absent.yaml") == SkulkConfig()


def test_empty_file_means_defaults():
    assert parse_config("", P) == SkulkConfig()


def test_full_config_parses():
    config = parse_config(
        """
node:
  name: studio
  api_port: 6000
  listen: [tcp/0.0.0.0:7447]
  bootstrap_peers: [tcp/10.0.0.2:7447]
  multicast: false
api:
  api_key: sekrit
model_store:
  store_host: 10.0.0.2
  staging_keep_recent_gb: 12.5
tracing:
  retention_days: 0
experiments:
  tts_streaming: true
""",
        P,
    )
    assert config.node.name == "studio" and config.node.api_port == 6000 and not config.node.multicast
    assert config.api.api_key == "sekrit"
    assert config.model_store.staging_keep_recent_gb == 12.5
    assert config.tracing.retention_days == 0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("nod:\n  name: x\n", "unknown key 'nod'"),
        ("node:\n  api_prot: 1\n", "unknown key 'node.api_prot'"),
        ("model_store:\n  stagng_keep_recent_gb: 1\n", "unknown key 'model_store.stagng_keep_recent_gb'"),
        ("node:\n  api_port: 70000\n", "key 'node.api_port'"),
        ("node:\n  multicast: maybe\n", "key 'node.multicast'"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("node: [\n", "not valid YAML"),
        ("kv_cache_backend: turbo\n", "key 'kv_cache_backend'"),
    ],
)
def test_bad_config_names_the_file_and_key(text, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(text, P)
    message = str(info.value)
    assert str(P) in message
    assert fragment in message


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("", {}, []),
    ("api:\n  cors_origins: [http://ui.lan:3000]\n", {}, ["http://ui.lan:3000"]),
    ("api:\n  cors_origins: [http://ui.lan:3000]\n", {"SKULK_CORS_ORIGINS": "http://a.lan/, https://b.lan"},
     ["http://a.lan", "https://b.lan"]),
    ("", {"SKULK_CORS_ORIGINS": "  "}, []),
    ("", {"SKULK_CORS_ORIGINS": "*"}, ["*"]),
])
def test_cors_origins_from_file_and_environment(text, env, expected):
    from skulk.datadir.config import with_env_overrides

    assert with_env_overrides(parse_config(text, P), env).api.cors_origins == expected


@pytest.mark.parametrize(
    ("text", "enabled", "endpoint", "flush_s"),
    [
        ("", False, "https://telemetry.foxlight.invalid/v1/skulk/field-samples", 60.0),
        ("telemetry:\n  enabled: true\n", True, "https://telemetry.foxlight.invalid/v1/skulk/field-samples", 60.0),
        ("telemetry:\n  endpoint: https://ingest.example/v1\n  flush_seconds: 5\n", False,
         "https://ingest.example/v1", 5.0),
        ("telemetry:\n  endpoint: http://127.0.0.1:9999/in\n", False, "http://127.0.0.1:9999/in", 60.0),
        ("telemetry:\n  endpoint: http://[::1]:9999/in\n", False, "http://[::1]:9999/in", 60.0),
        ("telemetry:\n  endpoint: http://localhost/in\n", False, "http://localhost/in", 60.0),
    ],
)
def test_telemetry_section(text, enabled, endpoint, flush_s):
    telemetry = parse_config(text, P).telemetry
    assert (telemetry.enabled, telemetry.endpoint, telemetry.flush_seconds) == (enabled, endpoint, flush_s)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("telemetry:\n  endpoint: http://ingest.example/v1\n", "http:// only to a loopback host"),
        ("telemetry:\n  endpoint: ftp://ingest.example/v1\n", "must be an https:// URL"),
        ("telemetry:\n  endpoint: ingest.example\n", "must be an https:// URL"),
        ("telemetry:\n  flush_seconds: 0\n", "telemetry.flush_seconds"),
        ("telemetry:\n  flush_seconds: 86400\n", "telemetry.flush_seconds"),
        ("telemetry:\n  enable: true\n", "unknown key 'telemetry.enable'"),
    ],
)
def test_telemetry_section_refuses(text, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_config(text, P)
