"""`skulk.yaml`: the node's strict configuration file.

Strict on purpose: a misspelt key is an error that names it, never a silently ignored
setting. The file is optional; every field has a default. Command-line flags and
environment variables override what the file says (the CLI applies that precedence).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_API_PORT = 52415


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSection(_Strict):
    name: str | None = None
    api_port: int = Field(DEFAULT_API_PORT, ge=1, le=65535)
    listen: list[str] = []
    bootstrap_peers: list[str] = []
    multicast: bool = True


class ApiSection(_Strict):
    host: str = "0.0.0.0"
    api_key: str | None = None
    cors_origins: list[str] = []
    """Browser origins allowed beside this machine's own ('*' for any); see skulk.api.cors."""


class ModelStoreSection(_Strict):
    store_host: str | None = None
    store_port: int = Field(58080, ge=1, le=65535)
    cleanup_on_deactivate: bool = True
    staging_keep_recent_gb: float = Field(40.0, ge=0)
    disk_reserve_gb: float = Field(10.0, ge=0)


class TracingSection(_Strict):
    retention_days: int = Field(3, ge=0)


class LoggingSection(_Strict):
    enabled: bool = False
    ingest_url: str | None = None


class ExperimentsSection(_Strict):
    """Deprecated switches kept only so an old skulk.yaml still parses; they do nothing."""

    tts_streaming: bool | None = None
    stt_realtime: bool | None = None
    speech_translation: bool | None = None


class SkulkConfig(_Strict):
    node: NodeSection = NodeSection()
    api: ApiSection = ApiSection()
    model_store: ModelStoreSection = ModelStoreSection()
    tracing: TracingSection = TracingSection()
    logging: LoggingSection = LoggingSection()
    kv_cache_backend: Literal["default", "mlx_quantized"] = "default"
    experiments: ExperimentsSection = ExperimentsSection()


class ConfigError(ValueError):
    """A config file that cannot be used, with the file and the offending key named."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"invalid config {path}: " + "; ".join(problems))


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "<top level>"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    if error["type"] == "missing":
        return f"missing key '{key}'"
    return f"key '{key}': {error['msg']}"


def parse_config(text: str, path: Path) -> SkulkConfig:
    """Parse YAML text into a config; pure apart from naming `path` in errors."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(path, [f"not valid YAML{where}: {getattr(exc, 'problem', exc)}"]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, ["the top level must be a mapping of sections"])
    try:
        return SkulkConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(path, [_describe(err) for err in exc.errors()]) from None


DISK_RESERVE_ENV = "SKULK_DISK_RESERVE_GB"
"""Environment override of `model_store.disk_reserve_gb` (the same name
`skulk.store.disk_admission` reads when no config is at hand)."""


CORS_ORIGINS_ENV = "SKULK_CORS_ORIGINS"
"""Environment override of `api.cors_origins`: comma-separated origins."""


def with_env_overrides(config: SkulkConfig, env: Mapping[str, str]) -> SkulkConfig:
    """`config` with the environment's overrides applied (environment beats the file, as
    the CLI's flags beat both). Pure; a malformed value is a ConfigError naming it."""
    cors = env.get(CORS_ORIGINS_ENV)
    if cors is not None and cors.strip():
        origins = [part.strip().rstrip("/") for part in cors.split(",") if part.strip()]
        config = config.model_copy(update={"api": config.api.model_copy(update={"cors_origins": origins})})
    raw = (env.get(DISK_RESERVE_ENV) or "").strip()
    if not raw:
        return config
    try:
        gib = float(raw)
    except ValueError:
        gib = -1.0
    if not gib >= 0:
        raise ConfigError(Path(f"${DISK_RESERVE_ENV}"), [f"{DISK_RESERVE_ENV}={raw!r}: expected a number of GiB >= 0"])
    store = config.model_store.model_copy(update={"disk_reserve_gb": gib})
    return config.model_copy(update={"model_store": store})


def load_config(path: Path) -> SkulkConfig:
    """Load `skulk.yaml`; a missing file means every default."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return SkulkConfig()
    return parse_config(text, path)
