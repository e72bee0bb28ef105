"""The Router: one zenoh peer session, typed and sealed pub/sub per topic, presence.

The router is the async shell of the transport. It owns the zenoh session, the egress
threads and the receive buffers; every decision it needs is in the pure modules beside it
(`envelope`, `presence`, `topics`, `buffers`). Components never touch zenoh: they publish
pydantic models on a `Topic` and receive `Received` items from a `TypedSubscription`.

Threads:
- zenoh calls each topic subscriber directly on its receive thread (a "direct" callback, not
  zenoh-python's default "indirect" one with its own queue), so a sample is size-checked
  against its topic's bound and its envelope authenticated before anything holds it: an
  unauthenticated or oversized sample is never queued. The same call decodes and validates
  the payload and offers the result to a bounded buffer that wakes the router's event loop
  (see `buffers.py`). It never waits on the consumer: a slow consumer costs drops (counted).
  Validation runs on zenoh's thread, so while it works zenoh's receive path for that link
  waits, as it did behind the indirect queue once that filled. Sessions end only when
  closed: always `await router.close()` (a hook closes forgotten sessions before the
  interpreter joins threads, with a warning).
- presence: one liveliness subscriber per router feeds a `PresenceVerifier`; the loop
  challenges new and due sessions (zenoh queries with a callback, never blocking) and every
  `PresenceWatch` gets the resulting node-level changes. Every authenticated sample also
  tells the verifier its session was heard (a proven session whose challenges fail while
  its messages arrive is kept, see presence.py).
- control and data publishes run on one egress thread per plane, so a publisher blocked by
  congestion on one plane never delays the other, and envelopes of one topic are sealed and
  handed to zenoh in one order (the receiver's replay check relies on it). Telemetry is put
  inline: it drops under congestion instead of waiting.

Wire: key expressions are `skulk/<NETWORK_VERSION>/<topic>[/<node>]`; the payload is the
msgpack of `model.model_dump(mode="json", by_alias=True)`, sealed by `envelope.Sealer`.

The router must never let bad input (foreign keys, garbage, other builds) stop the receive
path: every such sample is counted in `diagnostics()` and logged once per peer and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgpack
import zenoh
from pydantic import BaseModel, ValidationError

from skulk.routing import kick as zenoh_kick
from skulk.routing.buffers import BufferClosed, FifoBuffer, LatestBuffer, _LoopBuffer
from skulk.routing.constants import (
    KEY_ROOT,
    NETWORK_VERSION,
    PRESENCE_SEGMENT,
    check_id,
    is_valid_id,
    topic_key,
)
from skulk.routing.envelope import MAX_ENVELOPE_OVERHEAD_BYTES, EnvelopeRejected, Opener, Sealer
from skulk.routing.hearing import DEAF_AFTER_S, Hearing, should_kick, should_refresh
from skulk.routing.presence import (
    MAC_BYTES as PROOF_MAC_BYTES,
)
from skulk.routing.presence import (
    NONCE_BYTES as PROOF_NONCE_BYTES,
)
from skulk.routing.presence import (
    PROOF_TIMEOUT_S,
    Challenge,
    PresenceChange,
    PresenceRejected,
    PresenceToken,
    PresenceVerifier,
    parse_presence_key,
    presence_key_material,
    presence_token_key,
    proof_key_expr,
    proof_mac,
    proof_wait_s,
)
from skulk.routing.rejects import RejectLedger
from skulk.routing.topics import DEFAULT_QUEUE_CAPACITY, TOPICS, Plane, Topic, largest_payload_bytes
from skulk.shared.ticks import GRID_S, next_tick_at, until_tick_s

log = logging.getLogger("skulk.routing")

M = TypeVar("M")

# zenoh.open returns within ~0.5 s even when no bootstrap peer answers (it keeps retrying in
# the background); a hang past this means the runtime is wedged.
OPEN_TIMEOUT_S: Final = 15.0
# Session close normally takes milliseconds; past this we stop waiting and log, so node
# shutdown stays within the operator contract's 10 s.
CLOSE_TIMEOUT_S: Final = 5.0
# Bootstrap peers that are not up yet are retried from 250 ms, backing off to 2 s (zenoh's
# default starts at 1 s and backs off to 4 s, which slows cluster formation on start-up).
CONNECT_RETRY: Final = {"period_init_ms": 250, "period_max_ms": 2000, "period_increase_factor": 2}
# A peer that sends nothing (not even a keep-alive) for TRANSPORT_LEASE_MS is dropped and its
# presence token withdrawn: that is how a frozen node (SIGSTOP, a laptop lid, a swap storm) is
# noticed. zenoh's default is 10 s; 1 s with a keep-alive every 0.25 s drops a frozen peer
# 0.75-1 s after it froze, and the master fails its streams about 0.6 s later (hysteresis and
# plan pass, see master/presence_loss.py): within the 2 s the fault contract asks, measured by
# bench/failure_detection.py. A live peer keeps its link through a stall of up to ~0.75 s: the
# keep-alives are sent by zenoh's own (Rust) threads, so a busy Python event loop or a held GIL
# does not starve them; only the whole process stopping does. A stall longer than that drops
# the link, and the hysteresis still spares a peer whose presence is back within 0.5 s.
TRANSPORT_LEASE_MS: Final = 1000
TRANSPORT_KEEP_ALIVES_PER_LEASE: Final = 4
BLOCKED_SEND_CLOSE_US: Final = 2_000_000
"""A reliable (congestion: block) put that cannot queue for a peer for this long closes that
peer's transport (zenoh's `wait_before_close`, default 5 s). Measured on a network cut
(tests/chaos/test_chaos_netcut.py): while the master's puts to a cut peer blocked, its whole
zenoh runtime stalled, so presence challenges between it and a healthy peer went unanswered
for 4-5 s and the healthy peer was pruned too. Two leases: a peer that takes nothing for
that long is gone (its lease has run out twice); a live one reads within milliseconds."""
# Declared zenoh publishers kept per router (one per key expression; node-addressed topics
# have one per destination). The least recently used is undeclared past the bound.
MAX_PUBLISHERS: Final = 1024
DEFAULT_PRESENCE_CAPACITY: Final = 1024
PROOF_TICK_S: Final = 0.5
"""How often the router looks for presence proofs that are due or overdue (see presence.py's
PROOF_TIMEOUT_S and REPROOF_INTERVAL_S) while another node holds a token; a new token is
challenged at once, not on a tick."""
PROOF_IDLE_MAX_S: Final = 5.0
"""A node alone on its network (no other token) sleeps until its own session's next
challenge, at most this long (`presence.proof_wait_s`)."""


# Routers whose session is still open. zenoh-python runs each subscriber callback on a
# non-daemon Python thread that only ends when its subscriber is undeclared, so a process that
# forgets `await router.close()` would hang at exit; the hook below closes such sessions
# first. It must run before threading joins non-daemon threads, i.e. before `atexit`, hence
# `threading._register_atexit` (what concurrent.futures uses for the same reason).
_open_routers: weakref.WeakSet[Router] = weakref.WeakSet()


def _close_forgotten_routers() -> None:
    for router in list(_open_routers):
        if not router._closed:
            log.warning("router of node %s was not closed; closing its transport at exit", router.node_id)
            router._closed = True
            try:
                router._session.close()
            except Exception:  # exiting anyway
                pass


_register_before_thread_join = getattr(threading, "_register_atexit", None)
if _register_before_thread_join is not None:
    _register_before_thread_join(_close_forgotten_routers)


@dataclass(frozen=True, slots=True)
class PlaneQos:
    reliability: zenoh.Reliability
    congestion_control: zenoh.CongestionControl
    priority: zenoh.Priority


# Priorities give each plane its own zenoh transmission lane: control first, then telemetry
# (small, rate-limited, and heartbeats must not starve behind bulk output), then data.
PLANE_QOS: Final[dict[Plane, PlaneQos]] = {
    Plane.CONTROL: PlaneQos(zenoh.Reliability.RELIABLE, zenoh.CongestionControl.BLOCK, zenoh.Priority.INTERACTIVE_HIGH),
    Plane.TELEMETRY: PlaneQos(zenoh.Reliability.BEST_EFFORT, zenoh.CongestionControl.DROP, zenoh.Priority.INTERACTIVE_LOW),
    Plane.DATA: PlaneQos(zenoh.Reliability.RELIABLE, zenoh.CongestionControl.BLOCK, zenoh.Priority.DATA),
}


class RouterError(Exception):
    """Base of every error the router raises."""


class RouterOpenError(RouterError):
    """The zenoh session could not be opened (port in use, bad endpoint, wedged runtime)."""

    def __init__(self, message: str, *, listen: list[str], connect: list[str]) -> None:
        super().__init__(message)
        self.listen = listen
        self.connect = connect


class RouterClosed(RouterError):
    """The router is closed; nothing more can be published or subscribed."""


class TopicMisuse(RouterError, ValueError):
    """A publish or subscribe that does not fit the topic (type, addressing)."""

    def __init__(self, topic: Topic, message: str) -> None:
        super().__init__(f"topic {topic.name!r}: {message}")
        self.topic = topic


class PublishFailed(RouterError):
    """zenoh refused a put; `key_expr` is where it was going."""

    def __init__(self, topic: Topic, key_expr: str, cause: BaseException) -> None:
        super().__init__(f"publish on {key_expr} failed: {cause}")
        self.topic = topic
        self.key_expr = key_expr


SubscriptionClosed = BufferClosed


@dataclass(frozen=True, slots=True)
class Received(Generic[M]):
    """One validated message and who sent it (authenticated by the cluster key)."""

    sender: str
    session: str
    message: M


def build_zenoh_config(
    *, node_id: str, listen: list[str], connect: list[str], multicast: bool, max_message_bytes: int | None = None
) -> dict[str, Any]:
    """The peer-mode zenoh config of one node (plain data, see module notes for the choices).

    - peer mode: every node talks to every other directly; no zenoh router process.
    - listen: the given endpoints; none given keeps zenoh's default (all interfaces, random
      port), which multicast scouting advertises.
    - connect: bootstrap peers, retried quickly until they come up.
    - transport lease: TRANSPORT_LEASE_MS, so a frozen peer's presence goes within seconds;
      a blocked send to a peer closes its transport after BLOCKED_SEND_CLOSE_US.
    - multicast scouting on/off as asked; gossip scouting always on, so peers learn of each
      other through the peers they already know (needed with multicast off: a node that only
      knows one bootstrap peer still meshes with the rest).
    - max_message_bytes: zenoh's reassembly bound (the largest sealed message any topic admits).
    """
    link: dict[str, Any] = {"tx": {
        "lease": TRANSPORT_LEASE_MS, "keep_alive": TRANSPORT_KEEP_ALIVES_PER_LEASE,
        "queue": {"congestion_control": {"block": {"wait_before_close": BLOCKED_SEND_CLOSE_US}}},
    }}
    if max_message_bytes is not None:
        # zenoh refuses to reassemble anything larger (its default is 1 GiB): no peer, keyed
        # or not, can make this node buffer a message no topic admits.
        link["rx"] = {"max_message_size": max_message_bytes}
    config: dict[str, Any] = {
        "mode": "peer",
        "metadata": {"name": node_id},
        "connect": {"endpoints": list(connect), "retry": dict(CONNECT_RETRY)},
        "transport": {"link": link},
        "scouting": {
            "multicast": {"enabled": bool(multicast)},
            "gossip": {"enabled": True},
        },
    }
    if listen:
        config["listen"] = {"endpoints": list(listen)}
    return config


def _resolve(future: asyncio.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _run_in_daemon_thread(loop: asyncio.AbstractEventLoop, name: str, work: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run blocking zenoh work off the loop on a daemon thread (a wedged call cannot hold up exit)."""
    future: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:  # delivered to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(_resolve, future, result, error)
        except RuntimeError:
            pass  # loop already closed: nobody is waiting

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class TypedSubscription(Generic[M]):
    """Validated messages of one topic, in a bounded buffer owned by the router's loop.

    `await get()` / `async for item in sub` yield `Received` items; both end with
    `SubscriptionClosed` / end of iteration once the subscription or router is closed and
    the buffer is drained.
    """

    def __init__(self, router: Router, topic: Topic, key_expr: str, buffer: _LoopBuffer[Received[M]], *,
                 own: bool = True) -> None:
        self.topic = topic
        self._own = own
        self.key_expr = key_expr
        self._router = router
        self._buffer = buffer
        self._opener = Opener(router._wire_key)
        self._max_envelope_bytes = (topic.max_payload_bytes or 0) + MAX_ENVELOPE_OVERHEAD_BYTES
        self._subscriber: Any = None
        self._overflow_logged = False
        self._receive_errors = 0

    # -- consumer side (loop) --
    async def get(self) -> Received[M]:
        return await self._buffer.get()

    def get_nowait(self) -> Received[M]:
        return self._buffer.get_nowait()

    def __aiter__(self) -> AsyncIterator[Received[M]]:
        return self._buffer.__aiter__()

    def qsize(self) -> int:
        return self._buffer.qsize()

    @property
    def capacity(self) -> int:
        return self._buffer.capacity

    @property
    def dropped(self) -> int:
        return self._buffer.dropped

    def stats(self) -> dict[str, Any]:
        return {
            "topic": self.topic.name,
            "plane": self.topic.plane.value,
            "keyExpr": self.key_expr,
            **self._buffer.stats(),
            "receiveErrors": self._receive_errors,
        }

    def close(self) -> None:
        """Stop receiving; items already buffered can still be taken. Idempotent."""
        self._buffer.close()
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            try:
                subscriber.undeclare()
            except zenoh.ZError:
                pass  # session already closed: the subscriber went with it
        self._router._forget(self)

    # -- zenoh callback thread --
    def _on_sample(self, sample: zenoh.Sample) -> None:
        try:
            self._receive(sample)
        except Exception:
            # Never let one bad sample (or a bug in a latest_key function) end the stream.
            self._receive_errors += 1
            if self._receive_errors == 1:
                log.exception("receive path error on %s (sample dropped; further errors only counted)", self.key_expr)

    def _receive(self, sample: zenoh.Sample) -> None:
        if sample.kind != zenoh.SampleKind.PUT:  # pyo3 enums: compare by value, never `is`
            return
        key = str(sample.key_expr)
        ledger = self._router._rejects
        size = len(sample.payload)
        if size > self._max_envelope_bytes:
            # Refused before it is copied out of zenoh, decrypted or buffered: unauthenticated
            # bulk costs the receiver nothing but this comparison.
            ledger.record("oversize", None, where=key, detail=f"{size} bytes > {self._max_envelope_bytes}")
            return
        try:
            opened = self._opener.open(key, sample.payload.to_bytes())
        except EnvelopeRejected as rejected:
            ledger.record(rejected.reason, rejected.claimed_sender, where=key, detail=rejected.detail)
            return
        self._router._heard_from(opened.sender, opened.session)
        if not self._own and opened.sender == self._router.node_id:
            return  # our own message echoed back, which this subscriber has no use for
        try:
            raw = msgpack.unpackb(opened.payload, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            ledger.record("decode", opened.sender, where=key, detail=type(exc).__name__)
            return
        try:
            message = self.topic.type_adapter.validate_python(raw)
        except ValidationError as exc:
            ledger.record("invalid", opened.sender, where=key, detail=f"{exc.error_count()} validation errors")
            return
        item = Received(sender=opened.sender, session=opened.session, message=message)
        if self.topic.plane.latest_value:
            self._buffer.offer(item, (opened.sender, key, self.topic.latest_key(message)))
        elif not self._buffer.offer(item) and not self._overflow_logged and not self._buffer.closed:
            self._overflow_logged = True
            level = logging.WARNING if self.topic.plane is Plane.CONTROL else logging.INFO
            log.log(
                level,
                "receive queue of %s topic %s is full (capacity %d): dropping new messages; the consumer "
                "is too slow (logged once, drops counted in diagnostics)",
                self.topic.plane.value, self.topic.name, self._buffer.capacity,
            )


class PresenceWatch:
    """Node-level presence changes `PresenceChange(node_id, alive)` (unpacks as a tuple).

    Existing members are reported on start. A node is alive while one of its sessions holds
    a token and has proven the cluster key to this router lately (see `presence.py`: a copied
    token is never reported). Pending changes are kept latest-per-node, so a slow consumer
    always converges on the current membership. Every watch of a router shares its one
    liveliness subscriber and its proofs.
    """

    def __init__(self, router: Router, capacity: int) -> None:
        self._router = router
        self._buffer: LatestBuffer[PresenceChange] = LatestBuffer(router._loop, capacity)

    async def get(self) -> PresenceChange:
        return await self._buffer.get()

    def get_nowait(self) -> PresenceChange:
        return self._buffer.get_nowait()

    def __aiter__(self) -> AsyncIterator[PresenceChange]:
        return self._buffer.__aiter__()

    def alive(self) -> frozenset[str]:
        """Nodes currently holding a proven presence token (this node included once declared)."""
        return self._router._presence_alive()

    def stats(self) -> dict[str, Any]:
        return {"alive": sorted(self.alive()), **self._buffer.stats()}

    def close(self) -> None:
        self._buffer.close()
        self._router._forget(self)


class Router:
    """One node's transport. Create with `await Router.open(...)`, end with `await close()`."""

    def __init__(
        self,
        *,
        session: zenoh.Session,
        loop: asyncio.AbstractEventLoop,
        node_id: str,
        session_id: str,
        wire_key: bytes,
        network_version: str,
        expects_peers: bool = False,
    ) -> None:
        self._session = session
        self._loop = loop
        self.node_id = node_id
        self.session_id = session_id
        self.network_version = network_version
        self._wire_key = wire_key
        self._presence_key = presence_key_material(wire_key)
        self._sealer = Sealer(wire_key, node_id, session_id)
        self._rejects = RejectLedger()
        self._egress = {
            Plane.CONTROL: ThreadPoolExecutor(max_workers=1, thread_name_prefix="skulk-egress-control"),
            Plane.DATA: ThreadPoolExecutor(max_workers=1, thread_name_prefix="skulk-egress-data"),
        }
        self._publishers: OrderedDict[str, zenoh.Publisher] = OrderedDict()
        self._publishers_lock = threading.Lock()
        self._subscriptions: list[TypedSubscription[Any]] = []
        self._watches: list[PresenceWatch] = []
        self._presence_token: Any = None
        self._proof_queryable: Any = None
        self._presence_subscriber: Any = None
        self._verifier = PresenceVerifier(self._presence_key)
        self._verifier_lock = threading.Lock()
        self._hearing = Hearing()  # guarded by _verifier_lock
        self._refreshed_at: float | None = None
        self._refreshes = 0
        self._kicked_at: float | None = None
        self._kicks = 0
        self._kick_ready = zenoh_kick.install()  # from the main thread when the router opens there
        self._expects_peers = expects_peers  # bootstrap peers configured: being alone is a fault
        self._proof_ticker: asyncio.Task[None] | None = None
        self._proofs_woken = asyncio.Event()
        """Set (from a zenoh thread, through the loop) when a token appears: the proof loop
        challenges it at once and plans its next sleep anew."""
        self._published = 0
        self._publish_failures = 0
        self._counter_lock = threading.Lock()
        self._closed = False
        self._close_future: asyncio.Future[Any] | None = None
        _open_routers.add(self)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(
        cls,
        *,
        node_id: str,
        session_id: str,
        listen: list[str],
        connect: list[str],
        multicast: bool,
        wire_key: bytes,
        network_version: str = NETWORK_VERSION,
    ) -> Router:
        """Open a peer-mode zenoh session. `network_version` differs from the default only in
        tests that impersonate another build."""
        check_id("node id", node_id)
        check_id("session id", session_id)
        if len(wire_key) != 32:
            raise ValueError("wire_key must be 32 bytes (see cluster_key.derive_wire_key)")
        loop = asyncio.get_running_loop()
        config_data = build_zenoh_config(
            node_id=node_id, listen=listen, connect=connect, multicast=multicast,
            max_message_bytes=largest_payload_bytes(TOPICS) + MAX_ENVELOPE_OVERHEAD_BYTES,
        )
        try:
            config = zenoh.Config.from_json5(json.dumps(config_data))
        except zenoh.ZError as exc:
            raise RouterOpenError(f"invalid transport config: {exc}", listen=listen, connect=connect) from exc
        opening = _run_in_daemon_thread(loop, "skulk-router-open", lambda: zenoh.open(config))
        try:
            session = await asyncio.wait_for(asyncio.shield(opening), OPEN_TIMEOUT_S)
        except TimeoutError:
            # If it ever opens, close it rather than leak a session nobody holds.
            opening.add_done_callback(lambda f: f.exception() or f.result().close())
            raise RouterOpenError(
                f"transport did not open within {OPEN_TIMEOUT_S:.0f}s", listen=listen, connect=connect
            ) from None
        except zenoh.ZError as exc:
            raise RouterOpenError(
                f"cannot open transport (listen={listen}, connect={connect}): {exc}", listen=listen, connect=connect
            ) from exc
        log.info(
            "transport open: node %s session %s zid %s, listen %s, bootstrap %s, multicast %s, network %s",
            node_id, session_id, session.zid(), listen or "default", connect or "none",
            "on" if multicast else "off", network_version,
        )
        return cls(
            session=session, loop=loop, node_id=node_id, session_id=session_id,
            wire_key=bytes(wire_key), network_version=network_version, expects_peers=bool(connect),
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Close the session and end every subscription. Idempotent; waits at most CLOSE_TIMEOUT_S."""
        if self._close_future is None:
            self._closed = True
            if self._proof_ticker is not None:
                self._proof_ticker.cancel()
            for stream in [*self._subscriptions, *self._watches]:
                stream._buffer.close()
            for executor in self._egress.values():
                executor.shutdown(wait=False)  # queued puts fail fast with RouterClosed
            self._close_future = _run_in_daemon_thread(self._loop, "skulk-router-close", self._session.close)
        try:
            await asyncio.wait_for(asyncio.shield(self._close_future), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("transport of node %s did not close within %.0fs; abandoning it", self.node_id, CLOSE_TIMEOUT_S)
        except zenoh.ZError as exc:
            log.warning("transport of node %s closed with an error: %s", self.node_id, exc)

    async def __aenter__(self) -> Router:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RouterClosed(f"router of node {self.node_id} is closed")

    def _forget(self, stream: TypedSubscription[Any] | PresenceWatch) -> None:
        for streams in (self._subscriptions, self._watches):
            if stream in streams:
                streams.remove(stream)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ publish
    def key_for(self, topic: Topic, to_node: str | None = None) -> str:
        """The key expression a publish on `topic` (to `to_node`) goes to."""
        if topic.node_addressed:
            if to_node is None:
                raise TopicMisuse(topic, "is node-addressed: pass to_node")
            if not is_valid_id(to_node):
                raise TopicMisuse(topic, f"invalid destination node id {to_node!r}")
            return topic_key(topic.name, to_node, network_version=self.network_version)
        if to_node is not None:
            raise TopicMisuse(topic, "is not node-addressed: to_node must be None")
        return topic_key(topic.name, network_version=self.network_version)

    async def publish(self, topic: Topic, message: BaseModel, *, to_node: str | None = None) -> None:
        """Validate, pack, seal and put `message` on `topic`.

        Control and data publishes return once zenoh has taken the envelope (they wait while
        the network is congested); telemetry never waits and may be dropped under congestion.
        Publish from the router's event loop: envelopes of one topic must be sealed in order.
        """
        self._check_open()
        key = self.key_for(topic, to_node)
        if not isinstance(message, BaseModel):
            raise TopicMisuse(topic, f"expected a pydantic model, got {type(message).__name__}")
        try:
            topic.type_adapter.validate_python(message)
        except ValidationError:
            raise TopicMisuse(topic, f"does not carry {type(message).__name__}") from None
        payload = msgpack.packb(message.model_dump(mode="json", by_alias=True), use_bin_type=True)
        if len(payload) > (topic.max_payload_bytes or 0):
            # Every receiver would refuse it unread: say so here, typed, instead.
            raise TopicMisuse(topic, f"a {len(payload)}-byte payload is over the topic's bound of "
                                     f"{topic.max_payload_bytes} bytes")
        if topic.plane is Plane.TELEMETRY:
            self._put(topic, key, payload)
            return
        try:
            await self._loop.run_in_executor(self._egress[topic.plane], self._put, topic, key, payload)
        except RuntimeError as exc:  # executor shut down by close()
            if self._closed:
                raise RouterClosed(f"router of node {self.node_id} is closed") from None
            raise PublishFailed(topic, key, exc) from exc

    def _put(self, topic: Topic, key: str, payload: bytes) -> None:
        """Seal and hand to zenoh. Runs on the plane's egress thread (telemetry: the loop)."""
        self._check_open()
        envelope = self._sealer.seal(key, payload)
        try:
            self._publisher(key, topic.plane).put(envelope)
        except zenoh.ZError as exc:
            with self._counter_lock:
                self._publish_failures += 1
            if self._closed:
                raise RouterClosed(f"router of node {self.node_id} is closed") from None
            raise PublishFailed(topic, key, exc) from exc
        with self._counter_lock:
            self._published += 1

    def _publisher(self, key: str, plane: Plane) -> zenoh.Publisher:
        with self._publishers_lock:
            publisher = self._publishers.get(key)
            if publisher is not None:
                self._publishers.move_to_end(key)
                return publisher
            qos = PLANE_QOS[plane]
            publisher = self._session.declare_publisher(
                key,
                reliability=qos.reliability,
                congestion_control=qos.congestion_control,
                priority=qos.priority,
            )
            self._publishers[key] = publisher
            while len(self._publishers) > MAX_PUBLISHERS:
                _, evicted = self._publishers.popitem(last=False)
                evicted.undeclare()
            return publisher

    # ------------------------------------------------------------------ subscribe
    def subscribe(self, topic: Topic, *, maxsize: int | None = None, own: bool = True) -> TypedSubscription[Any]:
        """Receive `topic` (this node's own key for node-addressed topics).

        `maxsize` bounds the receive buffer (plane default from `DEFAULT_QUEUE_CAPACITY`).
        `own=False` drops this node's own messages (zenoh echoes a publisher's messages to its
        own subscribers) on the receive thread, once authenticated: a subscriber that ignores
        them then costs neither their decoding nor an event-loop wake-up for each.
        """
        self._check_open()
        capacity = maxsize if maxsize is not None else DEFAULT_QUEUE_CAPACITY[topic.plane]
        key = topic_key(topic.name, self.node_id if topic.node_addressed else None, network_version=self.network_version)
        buffer: _LoopBuffer[Received[Any]] = (
            LatestBuffer(self._loop, capacity) if topic.plane.latest_value else FifoBuffer(self._loop, capacity)
        )
        subscription: TypedSubscription[Any] = TypedSubscription(self, topic, key, buffer, own=own)
        # Direct (not zenoh-python's default "indirect") callback: the size check and the
        # envelope's authentication run on zenoh's receive thread as the sample arrives, so
        # no unauthenticated sample ever waits in a queue.
        subscription._subscriber = self._session.declare_subscriber(
            key, zenoh.handlers.Callback(subscription._on_sample, indirect=False))
        self._subscriptions.append(subscription)
        return subscription

    # ------------------------------------------------------------------ presence
    def declare_presence(self) -> None:
        """Announce this node (liveliness token) until the router closes, and answer the
        challenges that prove the token is this session's own. Idempotent."""
        self._check_open()
        if self._presence_token is None:
            key = presence_token_key(self._presence_key, self.node_id, self.session_id, network_version=self.network_version)
            mine = PresenceToken(self.node_id, self.session_id)
            proof_key = proof_key_expr(self.node_id, self.session_id, network_version=self.network_version)
            self._proof_queryable = self._session.declare_queryable(
                proof_key, lambda query: self._answer_challenge(query, mine))
            self._presence_token = self._session.liveliness().declare_token(key)

    def _answer_challenge(self, query: zenoh.Query, mine: PresenceToken) -> None:
        """zenoh thread: a MAC of the challenger's nonce; anything else gets no answer."""
        if query.payload is None or len(query.payload) != PROOF_NONCE_BYTES:
            return  # not a challenge of ours: no answer, and nothing copied
        nonce = query.payload.to_bytes()
        try:
            query.reply(query.key_expr, proof_mac(self._presence_key, mine, nonce))
        except zenoh.ZError:
            pass  # the challenger left: nothing to answer

    def watch_presence(self, *, maxsize: int = DEFAULT_PRESENCE_CAPACITY) -> PresenceWatch:
        """Membership changes of this cluster, starting with the nodes already present.

        Also watches other network versions' presence roots, so a node of another build is
        counted ("version") and logged rather than silently invisible.
        """
        self._check_open()
        watch = PresenceWatch(self, maxsize)
        self._watches.append(watch)
        with self._verifier_lock:
            alive = self._verifier.alive()
        for node in sorted(alive):
            watch._buffer.offer(PresenceChange(node, True), node)
        if self._presence_subscriber is None:
            selector = f"{KEY_ROOT}/*/{PRESENCE_SEGMENT}/**"
            self._presence_subscriber = self._session.liveliness().declare_subscriber(
                selector, self._on_token, history=True)
            self._proof_ticker = self._loop.create_task(self._tick_proofs_forever())
        return watch

    def _presence_alive(self) -> frozenset[str]:
        with self._verifier_lock:
            return self._verifier.alive()

    # -- presence: zenoh callback threads --
    def _on_token(self, sample: zenoh.Sample) -> None:
        try:
            self._observe_token(sample)
        except Exception:
            log.exception("presence path error (token event dropped)")

    def _observe_token(self, sample: zenoh.Sample) -> None:
        key = str(sample.key_expr)
        appeared = sample.kind == zenoh.SampleKind.PUT
        version = key.split("/")[1] if key.count("/") >= 2 else ""
        if version != self.network_version:
            # Another build on the same network: say so loudly, once per peer.
            if appeared:
                parts = key.split("/")
                claimed = parts[3] if len(parts) > 3 and is_valid_id(parts[3]) else None
                self._rejects.record("version", claimed, where=key, detail=f"peer runs {version!r}")
            return
        try:
            token = parse_presence_key(self._presence_key, key, network_version=self.network_version)
        except PresenceRejected as rejected:
            if appeared:
                reason = "auth" if rejected.reason == "auth" else "malformed"
                self._rejects.record(reason, rejected.claimed_node, where=key, detail="presence token")
            return
        with self._verifier_lock:
            if appeared:
                self._verifier.appeared(token)
            else:
                self._verifier.disappeared(token)
            changes = self._verifier.changes()
        self._emit(changes)
        if appeared:
            self._wake_proofs()

    def _on_proof(self, challenge: Challenge, reply: zenoh.Reply) -> None:
        try:
            sample = reply.ok
            if sample is None or len(sample.payload) != PROOF_MAC_BYTES:
                return  # an error, or an answer no MAC can be (anyone may answer a query)
            with self._verifier_lock:
                self._verifier.answered(challenge.token, challenge.nonce, sample.payload.to_bytes(), time.monotonic())
                changes = self._verifier.changes()
            self._emit(changes)
        except Exception:
            log.exception("presence proof path error (answer dropped)")

    def _heard_from(self, node_id: str, session_id: str) -> None:
        """zenoh thread: an authenticated message from this session (evidence of its life)."""
        now = time.monotonic()
        with self._verifier_lock:
            self._verifier.heard(PresenceToken(node_id, session_id), now)
            if node_id != self.node_id:  # our own messages echo back: they prove nothing
                self._hearing.heard(now)

    def _emit(self, changes: list[PresenceChange]) -> None:
        for change in changes:
            for watch in list(self._watches):
                watch._buffer.offer(change, change.node_id)

    def _wake_proofs(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._proofs_woken.set)
        except RuntimeError:
            pass  # the loop is closed: the router is going away

    # -- presence: the loop --
    async def _tick_proofs_forever(self) -> None:
        while not self._closed:
            self._proofs_woken.clear()
            self._tick_proofs()
            # On the process's tick grid (`shared.ticks`): the other periodic loops wake with it.
            wait_s = self._proof_wait_s()
            delay_s = (until_tick_s(self._loop.time(), PROOF_TICK_S) if wait_s == PROOF_TICK_S
                       else next_tick_at(self._loop.time() + wait_s, GRID_S) - self._loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._proofs_woken.wait()

    def _proof_wait_s(self) -> float:
        now = time.monotonic()
        with self._verifier_lock:
            return proof_wait_s(
                others_present=bool(self._verifier.present_nodes() - {self.node_id}),
                watching=self._hearing.deaf_since is not None
                or (self._expects_peers and self._hearing.alone_since is not None),
                due_at=self._verifier.next_due_at(now), now=now, tick_s=PROOF_TICK_S, longest_s=PROOF_IDLE_MAX_S)

    def _tick_proofs(self) -> None:
        """Send due challenges, count failed ones, report what changed."""
        if self._closed:
            return
        now = time.monotonic()
        with self._verifier_lock:
            challenges, failed = self._verifier.tick(now, lambda: os.urandom(PROOF_NONCE_BYTES))
            changes = self._verifier.changes()
            kept = self._verifier.last_kept
            self._hearing.peers(bool(self._verifier.present_and_heard() - {self.node_id}), now)
            went_deaf = self._hearing.tick(now)
            refresh = should_refresh(self._hearing, self._refreshed_at, now)
            kick = self._kick_ready and should_kick(self._hearing, self._kicked_at, now,
                                                    unanswered=self._verifier.last_missed > 0,
                                                    expects_peers=self._expects_peers)
            kick_reason = ("" if not kick else "deaf" if self._hearing.deaf_since is not None
                           else "alone" if self._hearing.alone_since is not None else "a challenge went unanswered")
        if went_deaf:
            log.warning("node %s hears none of its present peers (no authenticated message for %.0f s while their "
                        "presence tokens stay): its transport is deaf; the election decides nothing meanwhile",
                        self.node_id, DEAF_AFTER_S)
        if kick:
            self._kicked_at = now
            self._kick_zenoh(kick_reason)
        if refresh:
            self._refreshed_at = now
            self._refresh_declarations()
        for token in kept:
            log.info("presence challenges to node %s went unanswered twice, but its sealed messages keep arriving: "
                     "kept alive, challenged again", token.node_id)
        for token in failed:
            self._rejects.record("unproven", token.node_id, where=f"{PRESENCE_SEGMENT}/{token.node_id}/{token.session_id}",
                                 detail=f"no valid proof within {PROOF_TIMEOUT_S:g}s")
        self._emit(changes)
        for challenge in challenges:
            key = proof_key_expr(challenge.token.node_id, challenge.token.session_id, network_version=self.network_version)
            def on_reply(reply: zenoh.Reply, c: Challenge = challenge) -> None:
                self._on_proof(c, reply)

            try:
                self._session.get(key, zenoh.handlers.Callback(on_reply), payload=challenge.nonce,
                                  timeout=PROOF_TIMEOUT_S)
            except zenoh.ZError:
                return  # the session is closing; the next tick (if any) retries

    def deaf_for_s(self) -> float:
        """How long this node has heard none of its present peers (0.0 when it hears; see hearing.py)."""
        with self._verifier_lock:
            return self._hearing.deaf_for(time.monotonic())

    def _kick_zenoh(self, reason: str) -> None:
        """Interrupt every zenoh thread's wait (routing/kick.py): the cure for the stall in which
        bytes pile up unread while zenoh's threads sleep."""
        self._kicks += 1
        signalled = zenoh_kick.kick()
        log.warning("node %s: kicked %d zenoh threads out of their waits (kick %d; %s)",
                    self.node_id, signalled, self._kicks, reason)

    def _refresh_declarations(self) -> None:
        """Undeclare every subscription and the proof queryable and declare them again. New
        declarations make every peer recompute its routes to this node: the cure tried when
        this node is deaf (hearing.py). Old before new, so no sample is delivered twice (and
        refused as a replay); the moment between loses nothing a deaf node would have heard."""
        if self._closed:
            return
        self._refreshes += 1
        log.warning("node %s is deaf: declaring its %d subscriptions and its presence proof again (refresh %d)",
                    self.node_id, len(self._subscriptions), self._refreshes)
        try:
            for subscription in list(self._subscriptions):
                if subscription._subscriber is None:
                    continue
                subscription._subscriber.undeclare()
                subscription._subscriber = self._session.declare_subscriber(
                    subscription.key_expr, zenoh.handlers.Callback(subscription._on_sample, indirect=False))
            if self._proof_queryable is not None:
                mine = PresenceToken(self.node_id, self.session_id)
                proof_key = proof_key_expr(self.node_id, self.session_id, network_version=self.network_version)
                self._proof_queryable.undeclare()
                self._proof_queryable = self._session.declare_queryable(
                    proof_key, lambda query: self._answer_challenge(query, mine))
        except zenoh.ZError as exc:  # the session is closing: the router goes with it
            log.warning("refreshing the declarations of node %s failed: %s", self.node_id, exc)

    def connected_peer_count(self) -> int:
        """zenoh peers with an open transport to this node (any key: transport level)."""
        if self._closed:
            return 0
        try:
            return len(self._session.info.peers_zid())
        except zenoh.ZError:
            return 0

    # ------------------------------------------------------------------ diagnostics
    def rejected_count(self, reason: str, peer: str | None = None) -> int:
        return self._rejects.count(reason, peer)  # type: ignore[arg-type]

    def diagnostics(self) -> dict[str, Any]:
        """Queue depth/capacity/drops per topic, rejects by reason and peer, egress counters."""
        topics: dict[str, dict[str, Any]] = {}
        for subscription in list(self._subscriptions):
            stats = subscription.stats()
            entry = topics.setdefault(
                subscription.topic.name,
                {"plane": stats["plane"], "subscriptions": 0, "depth": 0, "capacity": 0,
                 "dropped": 0, "replaced": 0, "delivered": 0, "receiveErrors": 0},
            )
            entry["subscriptions"] += 1
            for field in ("depth", "capacity", "dropped", "replaced", "delivered", "receiveErrors"):
                entry[field] += stats[field]
        rejects = self._rejects.snapshot()
        with self._counter_lock:
            egress = {"published": self._published, "failed": self._publish_failures, "publishers": len(self._publishers)}
        return {
            "nodeId": self.node_id,
            "sessionId": self.session_id,
            "networkVersion": self.network_version,
            "closed": self._closed,
            "connectedPeers": self.connected_peer_count(),
            "topics": topics,
            "rejected": rejects["byReason"],
            "rejectedByPeer": rejects["byPeer"],
            "presence": [watch.stats() for watch in list(self._watches)],
            "presenceKeptByMessages": self._verifier.kept,
            "hearing": {"deafForS": round(self.deaf_for_s(), 1), "deafEpisodes": self._hearing.episodes,
                        "refreshes": self._refreshes, "kicks": self._kicks},
            "egress": egress,
        }

