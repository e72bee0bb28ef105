"""`skulk.yaml`: the node's strict configuration file.

Strict on purpose: a misspelt key is an error that names it, never a silently ignored
setting. The file is optional; every field has a default. Command-line flags and
environment variables override what the file says (the CLI applies that precedence).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from skulk.shared.body_limits import DEFAULT_MAX_BODY_BYTES, MAX_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES
from skulk.shared.settings import setting
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, KvCacheType, parse_kv_cache_type

DEFAULT_API_PORT = 52415


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeSection(_Strict):
    name: str | None = None
    api_port: int = Field(default=DEFAULT_API_PORT, ge=1, le=65535)
    listen: list[str] = []
    bootstrap_peers: list[str] = []
    multicast: bool = True


class ApiSection(_Strict):
    host: str = "0.0.0.0"
    api_key: str | None = None
    """The key non-loopback clients present; None: the node's own `api.key` in the data dir
    (created on first start, printed by `skulk api-key`)."""
    cors_origins: list[str] = []
    """Browser origins allowed beside this machine's own ('*' for any); see skulk.api.cors."""
    operator_key: str | None = None
    """When set, operator routes (placement, cards, store, tracing, diagnostics) require it
    and `api_key` is for inference only."""
    require_key_on_loopback: bool = False
    """Loopback clients need no key unless this is set (set it behind a local reverse proxy,
    where every client looks like loopback)."""
    open_to_lan: bool = False
    """Serve every client without a key. An explicit choice; the node warns at start."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=MIN_MAX_BODY_BYTES, le=MAX_MAX_BODY_BYTES)
    """Request bodies above this are refused with 413 before they are parsed (skulk.api.limits)."""
    allowed_hosts: list[str] = []
    """Extra names a request's Host header may carry (a DNS name or proxy in front of the
    node); the node's own host names and addresses are always allowed. "*" turns the check off."""


class ModelsSection(_Strict):
    local_dirs: list[str] = []
    """Directories `/models/add` may register local models from, besides the models dir."""


class ModelStoreSection(_Strict):
    store_host: str | None = None
    store_port: int = Field(default=58080, ge=1, le=65535)
    cleanup_on_deactivate: bool = True
    staging_keep_recent_gb: float = Field(default=40.0, ge=0)
    disk_reserve_gb: float = Field(default=10.0, ge=0)


class EventLogSection(_Strict):
    superseded_keep: int = Field(default=3, ge=0)
    """Event logs moved aside by a new session (`event_log.superseded-*`) kept, newest first."""
    superseded_max_age_days: float = Field(default=14.0, ge=0)
    """Older superseded logs are pruned even within the count; 0 means no age limit."""


class TracingSection(_Strict):
    retention_days: int = Field(default=3, ge=0)


class LoggingSection(_Strict):
    enabled: bool = False
    """JSON log lines on stdout (skulk.observe.structured_logs)."""
    ingest_url: str | None = None
    """Also POST them, in bounded batches, to this http(s) URL (needs `enabled`)."""

    @model_validator(mode="after")
    def _ingest_needs_json_lines(self) -> LoggingSection:
        if self.ingest_url is not None:
            if not self.enabled:
                raise ValueError("logging.ingest_url ships the JSON log lines: set logging.enabled: true too")
            if not self.ingest_url.startswith(("http://", "https://")):
                raise ValueError(f"logging.ingest_url must be an http:// or https:// URL, not {self.ingest_url!r}")
        return self


DEFAULT_TELEMETRY_ENDPOINT = "https://telemetry.foxlight.invalid/v1/skulk/field-samples"
"""Where opted-in field telemetry goes when `telemetry.endpoint` is unset: a placeholder
(`.invalid` never resolves) until the ledger's ingest service has its address; until then a
node that opts in without an endpoint counts failed sends and affects nothing else."""

DEFAULT_TELEMETRY_FLUSH_S = 60.0
MIN_TELEMETRY_FLUSH_S = 1.0
MAX_TELEMETRY_FLUSH_S = 3600.0
"""How often pending telemetry samples are sent: every minute by default; one second at the
least (tests), an hour at the most (samples wait in a bounded queue meanwhile)."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
"""Hosts a plain http:// telemetry endpoint may name (a local receiver, a test)."""


class TelemetrySection(_Strict):
    """Opt-in field telemetry (docs/TELEMETRY.md; `skulk.observe.field_telemetry`). Off
    unless an operator turns it on; `SKULK_TELEMETRY_DISABLE=1` wins over this section."""

    enabled: bool = False
    """The operator's consent; the dashboard's switch (`PUT /v1/telemetry`) writes it here."""
    endpoint: str = DEFAULT_TELEMETRY_ENDPOINT
    """The https:// URL batches are POSTed to (http:// only to a loopback host)."""
    flush_seconds: float = Field(default=DEFAULT_TELEMETRY_FLUSH_S, ge=MIN_TELEMETRY_FLUSH_S,
                                 le=MAX_TELEMETRY_FLUSH_S)

    @model_validator(mode="after")
    def _endpoint_is_https(self) -> TelemetrySection:
        problem = telemetry_endpoint_problem(self.endpoint)
        if problem is not None:
            raise ValueError(f"telemetry.endpoint {problem}")
        return self


def telemetry_endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be a telemetry endpoint (None: it can). Pure."""
    try:
        parsed = urlsplit(url)
        host = parsed.hostname
    except ValueError:
        return f"is not a URL: {url!r}"
    if parsed.scheme not in ("http", "https") or not host:
        return f"must be an https:// URL, not {url!r}"
    if parsed.scheme == "http" and host not in LOOPBACK_HOSTS:
        return f"must be https:// (http:// only to a loopback host such as 127.0.0.1), not {url!r}"
    return None


class ExperimentsSection(_Strict):
    """Deprecated switches kept only so an old skulk.yaml still parses; they do nothing."""

    tts_streaming: bool | None = None
    stt_realtime: bool | None = None
    speech_translation: bool | None = None


class SkulkConfig(_Strict):
    node: NodeSection = NodeSection()
    api: ApiSection = ApiSection()
    model_store: ModelStoreSection = ModelStoreSection()
    models: ModelsSection = ModelsSection()
    event_log: EventLogSection = EventLogSection()
    tracing: TracingSection = TracingSection()
    logging: LoggingSection = LoggingSection()
    kv_cache_backend: Annotated[KvCacheType, BeforeValidator(parse_kv_cache_type)] = DEFAULT_KV_CACHE_TYPE
    """The KV cache type this node's placements use when neither the placement nor the
    model's card names one: f16, q8_0 or q4_0 (`skulk.shared.types.kv_cache`)."""
    experiments: ExperimentsSection = ExperimentsSection()
    telemetry: TelemetrySection = TelemetrySection()


class ConfigError(ValueError):
    """A config file that cannot be used, with the file and the offending key named."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"invalid config {path}: " + "; ".join(problems))


def _describe(error: ErrorDetails) -> str:
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
`skulk.models.disk_admission` reads when no config is at hand)."""


CORS_ORIGINS_ENV = "SKULK_CORS_ORIGINS"
"""Environment override of `api.cors_origins`: comma-separated origins."""


def _gib(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _flag(raw: str) -> bool | None:
    return {"1": True, "true": True, "yes": True, "on": True,
            "0": False, "false": False, "no": False, "off": False}.get(raw.lower())


def _body_bytes(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and MIN_MAX_BODY_BYTES <= int(raw) <= MAX_MAX_BODY_BYTES else None


def _names(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


MAX_BODY_BYTES_ENV = "SKULK_API_MAX_BODY_BYTES"
"""Environment override of `api.max_body_bytes`."""

ENV_OVERRIDES: tuple[tuple[str, str, str, Any, str], ...] = (
    (DISK_RESERVE_ENV, "model_store", "disk_reserve_gb", _gib, "a number of GiB >= 0"),
    ("SKULK_OPERATOR_KEY", "api", "operator_key", lambda raw: raw, "a key"),
    ("SKULK_API_REQUIRE_KEY_ON_LOOPBACK", "api", "require_key_on_loopback", _flag, "true or false"),
    ("SKULK_API_OPEN_TO_LAN", "api", "open_to_lan", _flag, "true or false"),
    ("SKULK_ALLOWED_HOSTS", "api", "allowed_hosts", _names, "comma-separated host names"),
    (MAX_BODY_BYTES_ENV, "api", "max_body_bytes", _body_bytes,
     f"a whole number of bytes from {MIN_MAX_BODY_BYTES} to {MAX_MAX_BODY_BYTES}"),
    (CORS_ORIGINS_ENV, "api", "cors_origins", lambda raw: [o.rstrip("/") for o in _names(raw)],
     "comma-separated origins"),
    ("SKULK_MODELS_LOCAL_DIRS", "models", "local_dirs", lambda raw: [p for p in raw.split(os.pathsep) if p],
     f"directories separated by {os.pathsep!r}"),
)
"""Environment variable -> (section, key, parser, what it expects). The API key's own
variable (SKULK_API_KEY) is read by the CLI, which ranks it above the file."""


def with_env_overrides(config: SkulkConfig, env: Mapping[str, str]) -> SkulkConfig:
    """`config` with the environment's overrides applied (environment beats the file, as
    the CLI's flags beat both). Pure; a malformed value is a ConfigError naming it."""
    for variable, section_name, key, parse, expected in ENV_OVERRIDES:
        raw = setting(variable, env)
        if not raw:
            continue
        value = parse(raw)
        if value is None:
            raise ConfigError(Path(f"${variable}"), [f"{variable}={raw!r}: expected {expected}"])
        section = getattr(config, section_name).model_copy(update={key: value})
        config = config.model_copy(update={section_name: section})
    return config


def load_config(path: Path) -> SkulkConfig:
    """Load `skulk.yaml`; a missing file means every default."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return SkulkConfig()
    return parse_config(text, path)
