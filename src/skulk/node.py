"""Wires one Skulk node: lease, event log, router, election, state replica, event producer,
telemetry, membership, master (while elected) and API. Holds no policy: every decision
lives in a pure module; this file only connects subsystems and owns their lifetimes.

Lifecycle: acquire the data-dir lease (or exit naming its holder), open the event log and
the transport, serve until SIGINT/SIGTERM, a self-fence, or a subsystem failure, then shut
down within a bounded time: announce leaving, stop serving, close the transport and the
log (its live file is archived), release the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn

from skulk import __version__
from skulk.api.access import AccessPolicy
from skulk.api.app import ApiContext, create_app
from skulk.api.chat_middleware import embed_in_process
from skulk.api.context import LogLevelControl
from skulk.api.failover import failover_failures
from skulk.api.limits import RequestLimits
from skulk.api.node_access import access_policy, access_warnings, with_api_key, with_own_hosts
from skulk.api.speech_providers import (
    FIRST_PARTY_SOURCE,
    SpeechTagSync,
    always_advertised,
    first_party_providers,
    first_party_stats,
)
from skulk.api.streams import CommandStreams
from skulk.api.task_stream_ends import awaiting_terminal, completed_in, stream_end_for, stream_ends_in
from skulk.cluster.command_resend import CommandResender
from skulk.cluster.election import ElectionService
from skulk.cluster.master_role import master_api_endpoint, master_role_change
from skulk.cluster.membership import MembershipService
from skulk.cluster.producer import EventProducer
from skulk.cluster.replica import StateReplica
from skulk.cluster.task_inputs import TaskInputRelay
from skulk.cluster.telemetry import TelemetryService
from skulk.datadir.intent_record import INTENT_FILE, IntentRecord
from skulk.datadir.lease import Lease, LeaseHeldError
from skulk.datadir.paths import ensure_dirs
from skulk.datadir.secret_file import SecretFileError
from skulk.datadir.superseded_logs import retention_from
from skulk.extensions.capability_tags import CapabilityTags
from skulk.extensions.cluster_view import NodeView, cluster_view
from skulk.extensions.context import ExtensionContext
from skulk.extensions.loader import load_extensions
from skulk.extensions.middleware import ExtensionRuntime
from skulk.extensions.providers import ProviderFabric, registry_from
from skulk.facts.derive import DerivedBackends, derive_node_backends
from skulk.facts.network import listening_tcp, probe_interfaces
from skulk.facts.probe import probe_node_facts
from skulk.master.main import EventLogSlot, Master
from skulk.model_store.eviction import in_use_model_ids
from skulk.model_store.host import StoreAddress, StoreAddressError, StoreChoice, advertised_store, parse_store_address
from skulk.model_store.memory import load_remembered_store, remember_store
from skulk.model_store.node_store import NodeStore, StoreBinding, bind_store, binding_change, eviction_policy
from skulk.model_store.staging import staging_root_for
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.models.companions import companions_of
from skulk.node_settings import NodeSettings, settings_wire
from skulk.observe.field_collector import FieldTelemetry
from skulk.observe.field_telemetry import env_disables_telemetry, hardware_classes, serving_hardware
from skulk.observe.lost_members import LostMembers
from skulk.observe.metrics import ServingMetrics
from skulk.observe.node_report import redacted_config, versions
from skulk.observe.peer_http import peer_api_urls
from skulk.observe.recorder import FlightRecorder, LogRing
from skulk.observe.structured_logs import IngestShipper, structured_log_handlers
from skulk.observe.traces import TraceStore, master_decision_span, run_trace_janitor
from skulk.pool.layout import derive_pool_key
from skulk.provision.background_install import BackgroundInstall, decide_background_install
from skulk.provision.gpu_wheel import WheelInstall
from skulk.provision.llama_binary import ManagedInstall
from skulk.provision.llama_build import engine_search_dirs
from skulk.provision.node_engine import adopt_install
from skulk.routing.cluster_key import ClusterKeyError, derive_peer_token, derive_wire_key, resolve_cluster_key
from skulk.routing.constants import NETWORK_VERSION
from skulk.routing.invites import InviteBook
from skulk.routing.reachable import advertised_addresses, api_urls, transport_endpoints
from skulk.routing.router import Router, RouterError
from skulk.routing.topics import TOPICS, Topic
from skulk.shared import election as election_machine
from skulk.shared.hardware_class import hardware_class
from skulk.shared.input_transfer import INPUT_STREAM_ERRORS, TEST_DROP_INPUT_CHUNKS_ENV, dropped_input_chunks
from skulk.shared.membership import SelfInfo
from skulk.shared.serving import wait_explanation
from skulk.shared.telemetry_view import node_resources
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.commands import Command, ForwarderCommand
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.ids import NodeId, SessionId, new_id
from skulk.shared.types.invites import IssuedInvite, JoinRequest
from skulk.shared.types.node_facts import NodeFacts
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.task_inputs import TaskInput, TaskInputAck, TaskInputChunk, TransferError
from skulk.shared.types.telemetry import ServingCounters
from skulk.shared.wire_keys import to_camel_keys
from skulk.worker.main import Worker
from skulk.worker.staged_copies import StagedCopyKeeper
from skulk.worker.task_inputs import InputAssembler

logger = logging.getLogger(__name__)

LEAVE_ANNOUNCE_S = 1.5
RUNNERS_STOP_S = 3.0
SUBSYSTEM_STOP_S = 2.0
TRANSPORT_CLOSE_S = 1.5
"""Shutdown budget, step by step: announce leaving, stop runners (escalating to SIGKILL),
stop subsystems (the API drains streams meanwhile), close the transport. They add up to
8 s, inside the contract's 10 s; runner processes that outlive this exit on their own
when their parent is gone."""

API_GRACEFUL_SHUTDOWN_S = 1.5
"""Open HTTP streams get this long to finish before uvicorn closes them."""

STARTUP_RECONCILE_WAIT_S = 30.0
"""How long the startup staged-copy pass waits for the replica to sync (so it knows which
models this node's instances use) before running on what it has."""


class ExitCode:
    OK = 0
    FAILURE = 1
    USAGE = 2
    LEASE_HELD = 3
    FENCED = 4


API_TICK_S = 1.0
"""How often the API server's main loop wakes on its own (on the tick grid, `shared.ticks`):
to refresh the Date header (whose resolution is a second) and check its request limit.
uvicorn wakes every 0.1 s, which was 10 of an idle node's ~30 wake-ups a second
(bench/idle.py); exit is signalled at once."""

HOUSEKEEPING_TICK_S = 1.0
"""Period of the stream-expiry and command-resend loops (on the tick grid, `shared.ticks`)."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the node owns SIGINT/SIGTERM) and without its
    10 Hz tick: the main loop wakes every API_TICK_S, or at once when `should_exit` is set."""

    _exit_requested: asyncio.Event | None = None

    @property
    def should_exit(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit_requested is not None:
            self._exit_requested.set()

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield

    async def main_loop(self) -> None:
        self._exit_requested = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until_tick_s(asyncio.get_running_loop().time(), API_TICK_S)):
                    await self._exit_requested.wait()
            counter = (counter + 10) % 864000  # on_tick's once-a-second work runs when counter % 10 == 0
            should_exit = await self.on_tick(counter)


def bind_api_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = NodeId(new_id())
        self.session_id = new_id()
        self._stop = asyncio.Event()
        self._exit_code = ExitCode.OK
        self._master: Master | None = None
        self._master_task: asyncio.Task | None = None
        self.streams = CommandStreams(explain_wait=self._explain_wait)
        self.recorder = FlightRecorder()
        self.log_ring = LogRing()
        self.streams.on_lifecycle = self.recorder.on_stream
        self.worker: Worker | None = None
        self._explicit_store: StoreAddress | None = None
        self._own_store: StoreAddress | None = None
        self._own_hosts: frozenset[str] = frozenset()
        self._peer_token: str | None = None
        self._invites: InviteBook | None = None
        self._serving_metrics: ServingMetrics | None = None
        self._pool_key: bytes | None = None
        """This cluster's node-to-node HTTP credential (derived from the cluster key)."""
        self._access: AccessPolicy | None = None
        self._store_choice: StoreChoice | None = None
        self._remembered_store: StoreAddress | None = None
        """The master's store persisted by an earlier session (`store_memory.py`): used only
        until this session hears a master."""
        self._store_written: StoreAddress | None = None
        self._housekeeping: set[asyncio.Task] = set()
        self.log_shipper: IngestShipper | None = None
        self.capability_tags = CapabilityTags()
        """What this node advertises on the telemetry plane (extensions, later providers)."""
        self._first_party: list[Any] = []
        """The first-party speech providers (`skulk.api.speech_providers`): API nodes only."""
        self._api_context: ApiContext | None = None

    def request_stop(self, exit_code: int = ExitCode.OK, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            logger.info("node %s stopping: %s", self.node_id, reason)
            self._exit_code = exit_code
            self._stop.set()

    def _fenced(self, reason: str) -> None:
        self.request_stop(ExitCode.FENCED, reason)

    async def run(self) -> int:
        settings = self.settings
        try:
            self._explicit_store = (parse_store_address(settings.model_store.store_host, settings.api_port)
                                    if settings.model_store.store_host else None)
        except StoreAddressError as exc:
            logger.error("model_store.store_host: %s", exc)
            return ExitCode.USAGE
        self._remembered_store = self._store_written = await asyncio.to_thread(
            load_remembered_store, settings.paths.data_home)
        ensure_dirs(settings.paths)
        lease = Lease(settings.paths.lease_file, node_id=self.node_id, api_endpoint=settings.api_endpoint)
        try:
            lease.acquire()
        except LeaseHeldError as exc:
            logger.error("%s; stop it first or give this node its own --data-dir", exc)
            return ExitCode.LEASE_HELD
        structured, self.log_shipper = structured_log_handlers(self.settings.logging, self.node_id,
                                                               self.settings.node_name)
        handlers = [self.log_ring, *structured]
        for handler in handlers:
            logging.getLogger().addHandler(handler)
        try:
            return await self._run_holding_lease(lease)
        finally:
            for handler in handlers:
                logging.getLogger().removeHandler(handler)
                handler.close()
            lease.release()

    async def _open_router(self) -> Router:
        settings = self.settings
        key = resolve_cluster_key(settings.cluster_key, settings.paths.data_home, settings.cluster_key_file)
        self._peer_token = derive_peer_token(key)
        self._invites = InviteBook(key)
        self._pool_key = derive_pool_key(key)
        self._access = access_policy(settings, self._peer_token)
        return await Router.open(
            node_id=self.node_id,
            session_id=self.session_id,
            listen=list(settings.listen),
            connect=list(settings.bootstrap_peers),
            multicast=settings.multicast,
            wire_key=derive_wire_key(key, NETWORK_VERSION),
        )

    async def _run_holding_lease(self, lease: Lease) -> int:
        settings = self.settings
        log_slot = EventLogSlot(settings.paths.event_log_dir, retention=retention_from(settings.event_log))
        api_socket = None
        router: Router | None = None
        try:
            if settings.api_enabled:
                api_socket = bind_api_socket(settings.api_host, settings.api_port)
            router = await self._open_router()
        except OSError as exc:
            logger.error("cannot listen on %s:%s: %s", settings.api_host, settings.api_port, exc)
            return await self._abort(log_slot, router, ExitCode.FAILURE)
        except ClusterKeyError as exc:
            logger.error("cluster key: %s", exc)
            return await self._abort(log_slot, router, ExitCode.USAGE)
        except RouterError as exc:
            logger.error("cannot open the cluster transport: %s", exc)
            return await self._abort(log_slot, router, ExitCode.FAILURE)

        router.declare_presence()
        self.presence = router.watch_presence()  # long-lived: a master promoted later reads it at once
        facts = await asyncio.to_thread(probe_node_facts)  # once: backends and the engine build read it
        self._derived = self._derive_backends(facts)
        self.engine_build = await asyncio.to_thread(self._plan_engine_build, facts)
        interfaces = tuple(await asyncio.to_thread(probe_interfaces))
        self._own_store = advertised_store(settings.api_endpoint)
        self._own_hosts = frozenset({"localhost", "127.0.0.1", "::1", settings.api_host,
                                     *(a for i in interfaces for a in i.addresses)})
        self._access = with_own_hosts(self._access, settings, interfaces)
        found = await asyncio.to_thread(load_extensions)  # once: middleware and providers share it
        self.extensions = ExtensionRuntime(found, ExtensionContext(
            node_id=self.node_id, node_name=settings.node_name, embed_fn=self._embed_for_extensions,
            read_fn=self._read_cluster, tags=self.capability_tags))
        card_set = resolve_cards(builtin_cards_dir(), settings.paths.custom_cards_dir)
        for error in card_set.errors:
            logger.error("%s (ignored)", error)
        self.replica = StateReplica(router)
        self.replica.on_applied(self.recorder.on_event_applied)
        self.traces = TraceStore(self.node_id, settings.node_name, settings.paths.traces_dir)
        self.replica.on_applied(self._trace_master_decision)

        def cards():
            return {**card_set.cards, **self.replica.state.custom_cards}

        self.cards = cards
        self.producer = EventProducer(router)
        self.replica.on_applied(self.producer.observe)
        self.telemetry = TelemetryService(
            router, node_name=settings.node_name, models_dir=settings.paths.models_dir, api_endpoint=settings.api_endpoint,
            backends=lambda: list(self._derived.tags), conflicts=lambda: list(self._derived.conflicts),
            engine_slots=lambda: dict(self._derived.slots), engine_provision=lambda: self.engine_build.status,
            serving=self._serving_counters,
            disk_reserve_bytes=eviction_policy(settings.model_store).reserve_bytes,
            hardware_class=lambda ram_total_bytes, gpus: hardware_class(facts, ram_total_bytes, gpus),
            capability_tags=self.capability_tags.published,
        )
        self.field_telemetry = FieldTelemetry(
            settings.telemetry, env_disabled=env_disables_telemetry(), config_file=settings.paths.config_file,
            install_id_file=settings.paths.telemetry_install_id_file, version=__version__,
            builtin_model_ids=frozenset(card_set.cards) - card_set.custom_ids,
            hardware_of=lambda: hardware_classes(self.telemetry.view),
            serving_hardware=lambda ended, hardware: serving_hardware(
                self.replica.state, hardware, ended.command_id, ended.model_id),
            i_am_master=lambda: self._master is not None,
        )
        self.replica.on_applied(self.field_telemetry.on_event_applied)
        self.streams.on_ended = self.field_telemetry.on_stream_ended
        self.replica.on_applied(self._fail_streams_of_failed_tasks)
        self.replica.on_synced(self._fail_streams_failed_in_snapshot)
        self.lost_members = LostMembers()
        self.replica.on_applied(self.lost_members.observe)
        self.task_inputs = TaskInputRelay(send=lambda node_id, chunks: self._send_input(router, node_id, chunks),
                                          fail=self._fail_input)
        self.input_assembler = InputAssembler(
            deliver=self._deliver_input if settings.worker_enabled else None,
            answer=lambda node_id, ack: self._answer_input(router, node_id, ack))
        self.command_resender = CommandResender()
        self._first_party = first_party_providers(lambda: self._api_context) if settings.api_enabled else []
        first_party = [(FIRST_PARTY_SOURCE, lambda: self._first_party)] if self._first_party else []
        # registered first: they win their id@version
        self.capabilities = ProviderFabric(
            self.node_id,
            registry_from([*first_party, *((ext.shape.name, ext.obj.providers) for ext in found.with_hook("providers"))]),
            publish_control=lambda node_id, message: router.publish(TOPICS.provider_calls, message, to_node=node_id),
            publish_data=lambda node_id, message: router.publish(TOPICS.provider_data, message, to_node=node_id),
        )
        for refusal in self.capability_tags.advertise_all(always_advertised(self.capabilities.capability_tags())):
            logger.warning("a provider's capability is served but not advertised as a tag: %s", refusal)
        if first_party:  # stt@ / tts@ follow their ready models
            speech_tags = SpeechTagSync(self.capability_tags)
            self.replica.on_applied(lambda _indexed: speech_tags.sync(self.replica.state, cards()))
            self.replica.on_synced(lambda *_: speech_tags.sync(self.replica.state, cards()))
        self.replica.on_applied(lambda indexed: self.task_inputs.on_event(indexed, self.replica.state))
        self.intent = IntentRecord(settings.paths.data_home / INTENT_FILE)  # restored by a cold-start master
        self.replica.on_applied(lambda indexed: self.intent.observe(indexed, self.replica.state))
        self.staged_copies = StagedCopyKeeper(
            node_id=self.node_id, staging_root=staging_root_for(settings.paths.data_home),
            canonical_root=settings.paths.models_dir,  # a guard: never delete into the models dir
            policy=eviction_policy(settings.model_store),
            in_use=lambda: in_use_model_ids(self.replica.state, self.node_id, companions_of(cards)),
        )
        self.replica.on_applied(self.staged_copies.on_event)
        if settings.worker_enabled:
            self.worker = Worker(
                router, self.replica, self.producer, models_dir=settings.paths.models_dir, cards=cards,
                deliver_local=self.streams.deliver, publish_telemetry=self.telemetry.publish,
                store=self.store_binding, store_api_key=self._peer_token,
                on_deactivate=self.staged_copies.reconcile,
                disk_reserve_bytes=eviction_policy(settings.model_store).reserve_bytes,
                traces=self.traces,
                pool_key=self._pool_key,
            )
        me = SelfInfo(
            node_id=self.node_id, node_name=settings.node_name, version=__version__,
            api_endpoint=settings.api_endpoint, interfaces=interfaces,
        )
        self.membership = MembershipService(router, self.replica, self.producer, me, api_key=lambda: self._peer_token)
        self.election = ElectionService(
            router,
            commands_seen=lambda: self.replica.state.last_event_applied_idx + 1,
            members=lambda: frozenset(self.replica.state.nodes),
            on_elected=lambda elected: self._on_elected(elected, router, log_slot),
            on_demoted=self._stop_master,
            high_water=lambda: self.replica.state.last_event_applied_idx,
            on_leader_heard=self.replica.heard_leader,
        )

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop, ExitCode.OK, f"received {signal.Signals(sig).name}")

        tasks = [
            asyncio.create_task(lease.run_renewal(self._fenced), name="lease-renewal"),
            asyncio.create_task(self.replica.run(), name="replica"),
            asyncio.create_task(self.producer.run(), name="producer"),
            asyncio.create_task(self.telemetry.run(), name="telemetry"),
            asyncio.create_task(self.membership.run(), name="membership"),
            asyncio.create_task(self.election.run(), name="election"),
            asyncio.create_task(self._receive_output(router), name="data-receive"),
            asyncio.create_task(self._receive_task_inputs(router), name="task-input-receive"),
            asyncio.create_task(self._receive_input_acks(router), name="task-input-acks"),
            asyncio.create_task(self._expire_streams(), name="stream-expiry"),
            asyncio.create_task(self._resend_commands(router), name="command-resend"),
            asyncio.create_task(self.field_telemetry.run(), name="field-telemetry"),
            asyncio.create_task(self.capabilities.run(), name="capabilities"),
            asyncio.create_task(self._receive_capabilities(router, TOPICS.provider_calls), name="capability-calls"),
            asyncio.create_task(self._receive_capabilities(router, TOPICS.provider_data), name="capability-data"),
        ]
        if self.worker is not None:
            tasks.append(asyncio.create_task(self.worker.run(), name="worker"))
        self._spawn_housekeeping(self._startup_reconcile(), "staged-copies-startup")
        if self.engine_build.wanted:
            self._spawn_housekeeping(self.engine_build.run(self._adopt_engine_build), "engine-build")
        self._spawn_housekeeping(run_trace_janitor(settings.paths.traces_dir, settings.tracing.retention_days),
                                 "trace-janitor")
        server: _Server | None = None
        if api_socket is not None:
            server = self._make_api_server(router, log_slot, lease)
            tasks.append(asyncio.create_task(server.serve(sockets=[api_socket]), name="api"))
        api_server = server
        tasks.append(asyncio.create_task(
            self.extensions.run(lambda: api_server is None or bool(api_server.started)), name="extensions"))
        logger.info(
            "skulk %s node %s (%s) up; data %s; api %s; listen %s; peers %s",
            __version__, self.node_id, settings.node_name, settings.paths.data_home, settings.api_endpoint or "off",
            list(settings.listen) or "default", list(settings.bootstrap_peers) or "none",
        )
        stop_waiter = asyncio.create_task(self._stop.wait(), name="stop-waiter")
        done, _ = await asyncio.wait([stop_waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stop_waiter and not task.cancelled() and task.exception() is not None:
                logger.error("subsystem %s failed: %r", task.get_name(), task.exception())
                self.request_stop(ExitCode.FAILURE, f"{task.get_name()} failed")
        self.request_stop(self._exit_code, "a subsystem finished")
        await self._shutdown(server, tasks, stop_waiter, router)
        log_slot.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        logger.info("node %s stopped", self.node_id)
        return self._exit_code

    async def _abort(self, log_slot: EventLogSlot, router: Router | None, code: int) -> int:
        if router is not None:
            await router.close()
        log_slot.close()
        return code

    # -- election results --------------------------------------------------------------------

    def _on_elected(self, elected: election_machine.Elected, router: Router, log_slot: EventLogSlot) -> None:
        previous_session = self.replica.session_id
        self.recorder.record("election", master_id=elected.master_id, session_id=elected.session_id,
                             i_am_master=elected.i_am_master)
        self.replica.adopt_session(NodeId(elected.master_id), SessionId(elected.session_id), elected.i_am_master)
        self.store_binding()  # re-run the store choice for the new master (logs a change)
        running = self._master.session_id if self._master is not None and self._master_task is not None else None
        change = master_role_change(previous_session, elected.session_id, elected.i_am_master, running)
        if change.fail_failover_streams:
            # End only the streams the change affects (skulk.api.failover); the rest run on.
            affected = failover_failures(self.replica.state, self.streams.open_command_ids(), self.presence.alive(),
                                         elected.session_id)
            self.streams.fail_failover(StreamErrorType.MASTER_FAILOVER, affected)
        if change.stop_master:
            self._stop_master()
        if change.start_master:
            self._master = Master(
                router, self.replica, log_slot, lambda: self.telemetry.view, session_id=elected.session_id,
                cards=self.cards, presence=self.presence.alive, intent=lambda: self.intent.intent,
                ready_to_index=self.election.may_index,
            )
            self._master_task = asyncio.create_task(self._run_master(self._master), name="master")
        self.producer.resend_all()

    def _derive_backends(self, facts: NodeFacts) -> DerivedBackends:
        derived = derive_node_backends(facts)
        for conflict in derived.conflicts:
            logger.warning("capability conflict %s: %s", conflict.code, conflict.message)
        if not self.settings.worker_enabled:
            return DerivedBackends(tags=[], conflicts=list(derived.conflicts), slots=dict(derived.slots))
        return derived

    def _plan_engine_build(self, facts: NodeFacts) -> BackgroundInstall:
        search_dirs = engine_search_dirs(os.environ, Path.home(), self.settings.paths.data_home)
        decision = decide_background_install(os.environ, facts, worker_enabled=self.settings.worker_enabled,
                                             search_dirs=search_dirs)
        logger.info("background llama-server build: %s", getattr(decision, "reason", None) or "starting")
        return BackgroundInstall(decision, search_dirs)

    def _adopt_engine_build(self, install: ManagedInstall | WheelInstall) -> None:
        """The background build is ready: new runners start it (they inherit the environment),
        and the node advertises what it serves on (a GPU build adds its backends)."""
        if adopt_install(os.environ, install):
            self._spawn_housekeeping(self._rederive_backends(), "engine-build-adopt")

    async def _rederive_backends(self) -> None:
        self._derived = self._derive_backends(await asyncio.to_thread(probe_node_facts))

    def _trace_master_decision(self, indexed: IndexedEvent) -> None:
        """While this node is master, a traced task's binding joins the trace (master lane)."""
        decided = master_decision_span(indexed, self._master is not None, time.time() * 1e6)
        if decided is not None:
            trace_id, span = decided
            self.traces.add(trace_id, [span])
            self.traces.finish(trace_id)

    def _explain_wait(self, command_id: str) -> str | None:
        replica = getattr(self, "replica", None)  # set once the transport is up
        return wait_explanation(replica.state, command_id) if replica is not None else None

    def _fail_streams_of_failed_tasks(self, indexed: IndexedEvent) -> None:
        """A task this node's API owns failed or was cancelled in the cluster: end its stream.
        Completed: its terminal frame is due, so the stream ends typed if that frame was lost."""
        end = stream_end_for(self.replica.state, indexed.event, self.node_id)
        if end is not None:
            self.streams.fail(end.command_id, end.error_type, end.message, outcome=end.outcome)
        elif (completed := awaiting_terminal(self.replica.state, indexed.event, self.node_id)) is not None:
            self.streams.expect_terminal(completed)

    def _fail_streams_failed_in_snapshot(self) -> None:
        """A snapshot was adopted: end the streams whose task it already shows failed."""
        for end in stream_ends_in(self.replica.state, self.streams.open_command_ids(), self.node_id):
            self.streams.fail(end.command_id, end.error_type, end.message, outcome=end.outcome)
        for completed in completed_in(self.replica.state, self.streams.open_command_ids(), self.node_id):
            self.streams.expect_terminal(completed)

    async def _receive_output(self, router: Router) -> None:
        async for received in router.subscribe(TOPICS.data):
            self.streams.deliver(received.message)

    async def _receive_task_inputs(self, router: Router) -> None:
        async for received in router.subscribe(TOPICS.task_inputs):
            self.input_assembler.receive(received.sender, received.message)

    async def _receive_input_acks(self, router: Router) -> None:
        async for received in router.subscribe(TOPICS.task_input_acks):
            self.task_inputs.on_ack(received.message)

    async def _receive_capabilities(self, router: Router, topic: Topic) -> None:
        # own=False: a call to this node itself is delivered in-process by the fabric
        async for received in router.subscribe(topic, own=False):
            self.capabilities.deliver(received.sender, received.message)

    def _deliver_input(self, item: TaskInput) -> None:
        """A verified input reached this node: its task may now be dispatched."""
        assert self.worker is not None  # the assembler delivers only where a worker runs
        self.worker.accept_input(item)

    def _send_input(self, router: Router, node_id: str, chunks: tuple[TaskInputChunk, ...]) -> None:
        """Hand a request's input, in chunks, to the node that runs it (in-process when that
        is us: the same reassembly, check and ack)."""
        if node_id == self.node_id:
            for chunk in chunks:
                self.input_assembler.receive(self.node_id, chunk)
            return

        async def publish() -> None:
            dropped = dropped_input_chunks()
            try:
                for chunk in chunks:
                    if chunk.seq in dropped:
                        logger.warning("test knob %s: chunk %d of command %s not sent", TEST_DROP_INPUT_CHUNKS_ENV,
                                       chunk.seq, chunk.command_id)
                        continue
                    await router.publish(TOPICS.task_inputs, chunk, to_node=node_id)
            except RouterError as exc:  # the relay sends it again when no ack comes
                logger.warning("task input of command %s could not reach node %s: %s", chunks[0].command_id, node_id, exc)

        self._spawn_housekeeping(publish(), f"task-input-{chunks[0].transfer_id}")

    def _answer_input(self, router: Router, node_id: str, ack: TaskInputAck) -> None:
        """Tell the sender of a transfer how it ended (in-process when that is us)."""
        if node_id == self.node_id:
            self.task_inputs.on_ack(ack)
            return

        async def publish() -> None:
            try:
                await router.publish(TOPICS.task_input_acks, ack, to_node=node_id)
            except RouterError as exc:  # the sender sends the transfer again, and is answered again
                logger.warning("ack of task input %s could not reach node %s: %s", ack.command_id, node_id, exc)

        self._spawn_housekeeping(publish(), f"task-input-ack-{ack.transfer_id}")

    def _fail_input(self, command_id: str, error: TransferError, detail: str) -> None:
        """A request's input could not be handed over: its stream ends typed (and its route
        cancels the command, as for every stream this node ends)."""
        self.streams.fail(command_id, INPUT_STREAM_ERRORS[error], f"The request's input could not reach the serving "
                                                                  f"node ({error.value}): {detail}")

    async def _expire_streams(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_tick_s(loop.time(), HOUSEKEEPING_TICK_S))
            self.streams.expire()
            self.task_inputs.flush(self.replica.state)
            self.input_assembler.expire()

    async def _resend_commands(self, router: Router) -> None:
        """Publish again the commands whose task is not logged yet (`CommandResender`), in
        order and awaited (a congested publish delays the next resend, not stream expiry)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_tick_s(loop.time(), HOUSEKEEPING_TICK_S))
            origin = NodeId(self.node_id)
            for command in self.command_resender.tick(self.replica.state, self.streams.waiting_command_ids()):
                try:
                    await router.publish(TOPICS.commands, ForwarderCommand(origin=origin, command=command))
                except RouterError as exc:
                    logger.warning("command %s could not be published again: %s", command.command_id, exc)

    def _stop_master(self) -> None:
        if self._master_task is not None:
            logger.info("stepping down as master of session %s",
                        self._master.session_id if self._master is not None else None)
            self._master_task.cancel()
        self._master_task, self._master = None, None

    async def _run_master(self, master: Master) -> None:
        try:
            await master.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("master of session %s failed; this node stops", master.session_id)
            self.request_stop(ExitCode.FAILURE, "master failed")

    # -- model store -------------------------------------------------------------------------

    def _master_api_endpoint(self) -> str | None:
        """The elected master's advertised API endpoint (its store address), once known."""
        return master_api_endpoint(self.replica.master_id, self.replica.state, self.telemetry.view)

    def store_binding(self) -> StoreBinding | None:
        """The store this node uses now: the pure `bind_store` re-run on what the node knows
        (explicit store_host, the current master's endpoint, its own API, and until a master
        is heard the store remembered from before a restart), so the choice follows the
        master as it changes. Cheap: callers ask at the point of use; the only I/O is a small
        atomic write when the master names a store other than the remembered one."""
        master_endpoint = self._master_api_endpoint()
        if master_endpoint is not None:
            self._remembered_store = None  # the startup window is over: the master speaks now
        binding = bind_store(
            self.settings.paths, self.settings.model_store, explicit=self._explicit_store,
            master_endpoint=master_endpoint, own=self._own_store, own_hosts=self._own_hosts,
            remembered=self._remembered_store,
        )
        choice = binding.choice if binding is not None else None
        change = binding_change(choice, self._store_choice, self._store_written)
        if change.remember is not None:
            self._store_written = change.remember
            remember_store(self.settings.paths.data_home, change.remember)
        if change.announce is not None:
            self._store_choice = choice
            logger.info("%s", change.announce)
        return binding

    def _current_store(self) -> NodeStore | None:
        binding = self.store_binding()
        return binding.store if binding is not None else None

    async def _startup_reconcile(self) -> None:
        """The recency pass at startup, once the replica knows which models are in use:
        reconciles staged copies a crashed session left behind."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_RECONCILE_WAIT_S
        while not self.replica.synced and loop.time() < deadline:
            await asyncio.sleep(0.5)
        try:
            result = await self.staged_copies.reconcile()
        except Exception:
            logger.exception("startup staged-copy pass failed")
            return
        if result.removed:
            logger.info("startup staged-copy pass removed %s (%d bytes)", ", ".join(result.removed),
                        result.freed_bytes)

    def _spawn_housekeeping(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._housekeeping.add(task)
        task.add_done_callback(self._housekeeping.discard)

    # -- API -------------------------------------------------------------------------------

    def _diagnostics(self, router: Router, log_slot: EventLogSlot, lease: Lease) -> dict[str, Any]:
        return {
            "version": __version__,
            "sessionId": self.session_id,
            "settings": settings_wire(self.settings),
            "eventLog": to_camel_keys(log_slot.log.stats()),
            "lease": {"path": str(lease.path), "held": lease.held, "fencedReason": lease.fenced_reason},
            "transport": router.diagnostics(),
            "election": self.election.stats(),
            "replica": self.replica.stats(),
            "producer": self.producer.stats(),
            "telemetry": self.telemetry.stats(),
            "membership": self.membership.stats(),
            "streams": self.streams.stats(),
            "taskInputs": self.task_inputs.stats(),
            "inputTransfers": self.input_assembler.stats(),
            "commandResends": self.command_resender.stats(),
            "worker": self.worker.stats() if self.worker else None,
            "master": self._master.stats() if self._master else None,
            "modelStore": self._store_stats(),
            "flightRecorder": self.recorder.snapshot(),
            "traces": self.traces.stats(),
            "logShipping": self.log_shipper.stats() if self.log_shipper else None,
            "fieldTelemetry": self.field_telemetry.stats(),
            "recentLogs": self.log_ring.lines(),
            "config": redacted_config(self.settings),
            "versions": versions(),
            "intentRecord": self.intent.stats(),
            "extensions": self.extensions.stats(),
            "capabilities": {**self.capabilities.stats(), "speechProviders": first_party_stats(self._first_party)},
        }

    def _store_stats(self) -> dict[str, Any] | None:
        choice = self._store_choice
        if choice is None:
            return None
        return {"address": choice.address.base_url, "source": choice.source, "isSelf": choice.is_self,
                "stagedCopyEvictionsDropped": self.staged_copies.dropped_events}

    def _issue_invite(self, ttl_s: float) -> IssuedInvite:
        """A join invite carrying the endpoints another machine can reach this node at."""
        settings = self.settings
        addresses = advertised_addresses(probe_interfaces())
        assert self._invites is not None  # the API starts after the router (which makes the book)
        return self._invites.issue(
            time.time(), ttl_s, api_urls(settings.api_host, settings.api_port, addresses),
            transport_endpoints(settings.listen, listening_tcp(), settings.api_port, addresses))

    def _serving_counters(self) -> ServingCounters | None:
        """The API's serving totals with this node's runner load (telemetry's `serving`)."""
        loads = self.worker.instance_loads() if self.worker is not None else {}
        if self._serving_metrics is None and not loads:
            return None
        totals = self._serving_metrics.totals() if self._serving_metrics is not None else ServingCounters()
        return totals.model_copy(update={"instances": loads})

    def _redeem_invite(self, join: JoinRequest) -> str:
        assert self._invites is not None
        return self._invites.redeem(join.invite_id, join.proof, time.time(), join.node_name)

    def _make_api_server(self, router: Router, log_slot: EventLogSlot, lease: Lease) -> _Server:
        async def submit(command: Command) -> None:
            await router.publish(TOPICS.commands, ForwarderCommand(origin=self.node_id, command=command))
            self.command_resender.published(command)  # published again until its task is logged

        context = ApiContext(
            node_id=self.node_id,
            node_name=self.settings.node_name,
            get_state=lambda: self.replica.state,
            get_telemetry=lambda: self.telemetry.view,
            get_master=lambda: (self.replica.master_id, self.replica.session_id),
            get_diagnostics=lambda: self._diagnostics(router, log_slot, lease),
            submit_command=submit,
            hold_input=self.task_inputs.hold,
            discard_input=self.task_inputs.discard,
            streams=self.streams,
            get_cards=self.cards,
            get_resources=lambda: node_resources(self.telemetry.view, self.replica.state),
            access=self._access,
            local_model_dirs=(self.settings.paths.models_dir, *self.settings.local_model_dirs),
            kv_cache_type=self.settings.kv_cache_type,
            cors_origins=self.settings.cors_origins,
            store_lookup=self._current_store,
            limits=RequestLimits(max_body_bytes=self.settings.api_max_body_bytes),
            traces=self.traces,
            sessions_dir=self.settings.paths.data_home / "sessions",
            log_level=LogLevelControl(),
            issue_invite=self._issue_invite if self._invites is not None else None,
            redeem_invite=self._redeem_invite if self._invites is not None else None,
            get_peer_urls=lambda: peer_api_urls(self.replica.state, self.membership.probed, self.node_id),
            get_lost_members=lambda: self.lost_members.recent(self.replica.state),
            get_telemetry_status=self.field_telemetry.status,
            set_telemetry_enabled=self.field_telemetry.set_enabled,
            preview_telemetry=self.field_telemetry.preview,
            extensions=self.extensions,
            capabilities=self.capabilities,
        )
        self._api_context = context
        self.replica.on_applied(context.state_feed.record)
        self._state_feed = context.state_feed
        app = create_app(context)
        self._serving_metrics = app.state.metrics
        config = uvicorn.Config(
            app,
            log_level="warning",
            # uvicorn annotates an int but hands it to asyncio.wait_for, which takes any float.
            timeout_graceful_shutdown=API_GRACEFUL_SHUTDOWN_S,  # pyright: ignore[reportArgumentType]
            lifespan="off",
        )
        return _Server(config)

    # -- extensions ------------------------------------------------------------------------

    async def _embed_for_extensions(self, model: str, inputs: Sequence[str]) -> list[list[float]]:
        if self._api_context is None:
            raise RuntimeError("this node runs no API, so it serves no embeddings to extensions")
        return await embed_in_process(self._api_context, model, inputs)

    def _read_cluster(self) -> tuple[NodeView, ...]:
        return cluster_view(self.replica.state, self.telemetry.view, self.replica.master_id, self.node_id,
                            time.monotonic(), datetime.now(UTC))

    # -- shutdown --------------------------------------------------------------------------

    async def _shutdown(
        self, server: _Server | None, tasks: list[asyncio.Task], stop_waiter: asyncio.Task, router: Router
    ) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.membership.leave(), timeout=LEAVE_ANNOUNCE_S)
        if self.worker is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.worker.shutdown(), timeout=RUNNERS_STOP_S)
        if server is not None:
            self._state_feed.close()  # open /v1/events streams end now, not at the grace deadline
            server.should_exit = True
        if self._master_task is not None:
            self._master_task.cancel()
            tasks.append(self._master_task)
        for task in tasks:
            if task.get_name() != "api":
                task.cancel()
        for task in list(self._housekeeping):
            task.cancel()
        stop_waiter.cancel()
        _, pending = await asyncio.wait([*tasks, stop_waiter], timeout=SUBSYSTEM_STOP_S)
        for task in pending:
            logger.warning("subsystem %s did not stop in time; cancelling", task.get_name())
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(router.close(), TRANSPORT_CLOSE_S)


def run_node(settings: NodeSettings) -> int:
    # Whatever the node writes (event log, snapshots, keys, traces) is for its user alone.
    os.umask(0o077)
    try:
        settings = with_api_key(settings)
    except SecretFileError as exc:
        logger.error("api key: %s", exc)
        return ExitCode.USAGE
    for warning in access_warnings(settings):
        logger.warning("%s", warning)
    return asyncio.run(Node(settings).run())


def default_node_name() -> str:
    return socket.gethostname()
