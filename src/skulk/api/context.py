"""What the API's routes know of their node: `ApiContext`, plain callables and values that
`skulk.node` wires, so every route stays testable with a hand-built context; and
`api_context`, the typed way a route reaches it.

Routes read node data only through this and never reach into subsystems directly. It lives
apart from `skulk.api.app` (which imports every route) so that routes can import it
without an import circle.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import HTTPConnection

from skulk.api.access import AccessPolicy
from skulk.api.limits import RequestLimits
from skulk.api.state_feed import StateFeed
from skulk.api.streams import CommandStreams
from skulk.extensions.providers.fabric import ProviderFabric
from skulk.observe.field_telemetry import TelemetryPreview, TelemetryStatus
from skulk.observe.traces import TraceStore
from skulk.shared.serving import serving
from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import Command
from skulk.shared.types.ids import ModelId, NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.invites import IssuedInvite, JoinRequest
from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, KvCacheType
from skulk.shared.types.state import State
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.telemetry import NodeResources

if TYPE_CHECKING:  # a type only: the API does not use the store's code
    from skulk.extensions.middleware import ExtensionRuntime
    from skulk.model_store.node_store import NodeStore


class LogLevelControl:
    """The process's root log level, as the diagnostics routes read and change it."""

    def get(self) -> str:
        return logging.getLevelName(logging.getLogger().level)

    def set(self, level: str) -> None:
        logging.getLogger().setLevel(level)
        logging.getLogger(__name__).warning("log level set to %s through the API (until restart)", level)


async def _no_cluster(_command: Command) -> None:
    raise RuntimeError("this node is not connected to a cluster")


def _no_relay(_item: TaskInput | str) -> None:
    """A context with no cluster has nobody to hand a request's text to."""


@dataclass(frozen=True)
class ApiContext:
    node_id: str
    node_name: str
    get_state: Callable[[], State]
    get_telemetry: Callable[[], TelemetryView] = field(default=TelemetryView)
    get_master: Callable[[], tuple[str | None, str | None]] = field(default=lambda: (None, None))
    get_diagnostics: Callable[[], dict[str, Any]] = field(default=lambda: {})
    submit_command: Callable[[Command], Awaitable[None]] = field(default=_no_cluster)
    hold_input: Callable[[TaskInput], None] = field(default=_no_relay)
    """Keep a request's full params until the master binds its task, then send them to the
    node that runs it (`skulk.cluster.task_inputs.TaskInputRelay.hold`): the command the
    master sees carries redacted params only."""
    discard_input: Callable[[str], None] = field(default=_no_relay)
    """Forget the held input of a command that never reached the master."""
    streams: CommandStreams = field(default_factory=CommandStreams)
    """This node's open command streams: the node calls `streams.deliver(frame)` for every
    DATA frame addressed to it, and `streams.fail_all` when the master session changes."""
    instance_lookup: Callable[[str], Instance | None] | None = None
    """Overrides `find_instance` (None: a lookup in `get_state()`)."""
    instance_listing: Callable[[], list[Instance]] | None = None
    """Overrides `list_instances` (None: those in `get_state()`)."""
    get_cards: Callable[[], Mapping[ModelId, ModelCard]] = field(default=dict)
    """Model cards this node resolves (built-in, local custom, cluster custom)."""
    get_resources: Callable[[], Mapping[NodeId, NodeResources]] = field(default=dict)
    """Latest NodeResources of every member (the placement planner's memory input)."""
    api_key: str | None = None
    """When set, every route but the dashboard's static assets requires this key (Bearer,
    or `x-api-key` on /v1/messages); None or empty leaves the API open. The node passes
    `SKULK_API_KEY` (`skulk.api.auth.API_KEY_ENV`) or its configured key."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed beside this machine's own (`skulk.api.cors`)."""
    local_model_dirs: tuple[Path, ...] = ()
    """Directories `POST /models/add` may register local models from (the node passes its
    models dir and `models.local_dirs`); none: local paths are refused."""
    kv_cache_type: KvCacheType = DEFAULT_KV_CACHE_TYPE
    """The node's KV cache type for placements that name none (skulk.yaml `kv_cache_backend`)."""
    access: AccessPolicy | None = None
    """The node's full access policy (keys, roles, loopback, Host check: `skulk.api.access`).
    When None, `api_key` alone is required on every route but static assets, from every
    client (the shape of hand-built test apps)."""
    store: NodeStore | None = None
    """The model store's roots and policy on this node (None: the /store routes answer 503)."""
    store_lookup: Callable[[], NodeStore | None] | None = None
    """Overrides `get_store` (None: `store`)."""
    state_feed: StateFeed = field(default_factory=StateFeed)
    """Wakes `GET /v1/events` streams; the node calls `state_feed.record` per applied event."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """Request bounds (body size; see `skulk.api.limits`), enforced before any route parses."""
    traces: TraceStore | None = None
    """This node's parts of task-scoped traces (None: requests are never traced here)."""
    get_lost_members: Callable[[], Mapping[str, str]] = field(default=dict)
    """Members that left recently (node -> why), still listed unreachable by cluster
    diagnostics (`skulk.observe.lost_members`)."""
    sessions_dir: Path | None = None
    """Where `POST /v1/sessions/{id}/snapshot` writes (`<data>/sessions`); None: snapshots
    are returned but not stored."""
    log_level: LogLevelControl | None = None
    """This node's log level, read and set at run time (None: an API outside a node)."""
    issue_invite: Callable[[float], IssuedInvite] | None = None
    """Issue a join invite valid for this many seconds (`skulk.routing.invites.InviteBook`
    with this node's endpoints); None: this node issues none (the routes answer 503)."""
    redeem_invite: Callable[[JoinRequest], str] | None = None
    """Redeem a joining node's proof: the invite's release, or `InviteRefused`."""
    get_peer_urls: Callable[[], Mapping[str, str | None]] = field(default=dict)
    """Every other member's API base URL (None: it has none), for cluster diagnostics and
    trace gathering (`skulk.observe.peer_http`)."""
    get_telemetry_status: Callable[[], TelemetryStatus] | None = None
    """Opt-in field telemetry's switch, endpoint, queue and counters
    (`skulk.observe.field_collector.FieldTelemetry.status`); None: the /v1/telemetry routes answer 503."""
    set_telemetry_enabled: Callable[[bool], Awaitable[TelemetryStatus]] | None = None
    """The operator's consent switch, persisted in skulk.yaml; raises `TelemetryDisabledByEnv`
    (turning it on where SKULK_TELEMETRY_DISABLE is set) or `TelemetryConfigUnwritable`."""
    preview_telemetry: Callable[[], TelemetryPreview] | None = None
    """The batch the next flush would send, exactly."""
    extensions: ExtensionRuntime | None = None
    """The node's loaded extensions, guarded (`skulk.extensions.middleware`): chat routes
    pass their params through its transforms and tap their output for its observers
    (`skulk.api.chat_middleware`). None: no extension hooks run."""
    capabilities: ProviderFabric | None = None
    """This node's end of capability calls (`skulk.extensions.providers`): its registry and
    `call_capability`; None: `/v1/capabilities` lists nothing here and calls answer 503."""

    @property
    def peer_credential(self) -> str | None:
        """What this node presents to its peers' APIs: the cluster's peer token (see
        `skulk.api.access`), or the shared API key of a hand-built context."""
        return self.access.peer_token if self.access is not None else self.api_key

    def find_instance(self, model_id: str) -> Instance | None:
        """The placed instance a request for `model_id` binds to (None: 404)."""
        if self.instance_lookup is not None:
            return self.instance_lookup(model_id)
        return find_placed_instance(self.get_state(), model_id)

    def list_instances(self) -> list[Instance]:
        """Every placed instance."""
        if self.instance_listing is not None:
            return self.instance_listing()
        return list(self.get_state().instances.values())

    def get_store(self) -> NodeStore | None:
        """The model store as it is now (it follows the elected master); None: the /store
        routes answer 503."""
        return self.store_lookup() if self.store_lookup is not None else self.store


def find_placed_instance(state: State, model_id: str) -> Instance | None:
    """An instance of `model_id` in `state`, preferring one whose runners all serve; the
    master makes the final choice when it creates the task."""
    candidates = sorted((i for i in state.instances.values() if i.model_id == model_id), key=lambda i: i.instance_id)
    serving_now = [i for i in candidates if serving(state, i)]
    return (serving_now or candidates or [None])[0]


def api_context(connection: HTTPConnection) -> ApiContext:
    """The node's ApiContext, from any HTTP request or WebSocket of its app."""
    return cast(ApiContext, connection.app.state.skulk)


__all__ = ["ApiContext", "api_context", "find_placed_instance"]
