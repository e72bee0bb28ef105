"""A node's settings, as the CLI and config file resolve them, and how operators read them.

Kept apart from `skulk.node` (the composition root) so that the parts that read settings
(the API's access policy, diagnostics) do not import the whole node.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skulk.datadir.config import EventLogSection, LoggingSection, ModelStoreSection, TelemetrySection, TracingSection
from skulk.datadir.paths import SkulkPaths
from skulk.facts.network import probe_interfaces
from skulk.shared.body_limits import DEFAULT_MAX_BODY_BYTES
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, KvCacheType
from skulk.shared.wire_keys import to_camel_keys


@dataclass(frozen=True)
class NodeSettings:
    paths: SkulkPaths
    node_name: str
    api_host: str = "0.0.0.0"
    api_port: int = 52415
    listen: tuple[str, ...] = ()
    bootstrap_peers: tuple[str, ...] = ()
    multicast: bool = True
    cluster_key: str | None = field(default=None, repr=False)
    cluster_key_file: Path | None = None
    api_key: str | None = field(default=None, repr=False)
    """The key non-loopback clients present; None: the data dir's `api.key` (created on
    first start). See `skulk.api.access` for the whole policy."""
    operator_key: str | None = field(default=None, repr=False)
    require_key_on_loopback: bool = False
    open_to_lan: bool = False
    allowed_hosts: tuple[str, ...] = ()
    local_model_dirs: tuple[Path, ...] = ()
    kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """skulk.yaml's `kv_cache_backend`: the KV cache type of the placements this node's API
    makes when neither the request nor the card names one."""
    """Directories `/models/add` may register local models from, besides the models dir."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed beside this machine's own (skulk.api.cors)."""
    api_enabled: bool = True
    api_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Request bodies above this get 413 before they are parsed (`api.max_body_bytes`)."""
    worker_enabled: bool = True
    model_store: ModelStoreSection = ModelStoreSection()
    tracing: TracingSection = TracingSection()
    logging: LoggingSection = LoggingSection()
    event_log: EventLogSection = EventLogSection()
    telemetry: TelemetrySection = TelemetrySection()
    """Opt-in field telemetry as skulk.yaml says at start (`PUT /v1/telemetry` changes it)."""

    @property
    def api_endpoint(self) -> str | None:
        """The address peers and clients should use for this node's API."""
        if not self.api_enabled:
            return None
        host = self.api_host
        if host in ("0.0.0.0", "::", ""):
            host = _primary_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.api_port}"


def settings_wire(settings: NodeSettings) -> dict[str, Any]:
    """The node's effective settings as operators read them (diagnostics, dashboard). Secrets
    are reported as set or not, never shown. Pure."""
    return {
        "nodeName": settings.node_name, "apiHost": settings.api_host, "apiPort": settings.api_port,
        "apiEndpoint": settings.api_endpoint if settings.api_enabled else None,
        "listen": list(settings.listen), "bootstrapPeers": list(settings.bootstrap_peers),
        "multicast": settings.multicast, "apiKeySet": bool(settings.api_key),
        "clusterKeyGiven": settings.cluster_key is not None,
        "apiEnabled": settings.api_enabled, "workerEnabled": settings.worker_enabled,
        "dataDir": str(settings.paths.data_home), "modelsDir": str(settings.paths.models_dir),
        "configFile": str(settings.paths.config_file),
        "modelStore": to_camel_keys(settings.model_store.model_dump()),
    }


def _primary_address() -> str:
    """First non-loopback IPv4 of this machine, or loopback on an offline host."""
    for interface in probe_interfaces():
        for address in interface.addresses:
            if not ipaddress.ip_address(address).is_loopback:
                return address
    return "127.0.0.1"


__all__ = ["NodeSettings", "settings_wire"]
