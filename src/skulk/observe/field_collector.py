"""Opt-in field telemetry, the shell: collects samples as the node sees generations end and
members get pruned, keeps them in a bounded queue, and POSTs them as one JSON batch every
`telemetry.flush_seconds` while collection is on (docs/TELEMETRY.md). Every decision (what a
sample holds, whether collection is on, what an answer means for the batch) is
`skulk.observe.field_telemetry`'s.

It must never affect inference: the hooks the API's streams and the replica call are cheap,
synchronous and never raise; a send has a deadline (`SEND_DEADLINE_S`), runs in this
node-owned task only, and fails silently (one info line when sending starts failing, one
when it recovers, counters always). It must never log or send a prompt, an output, a key, a
host name or an address: it logs counts and exception class names only.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import httpx

from skulk.datadir.atomic_file import write_atomic
from skulk.datadir.config import ConfigError, TelemetrySection
from skulk.datadir.config_edit import with_telemetry_enabled
from skulk.datadir.secret_file import SecretFileError, load_or_create_secret, read_secret_file
from skulk.observe.field_telemetry import (
    SEND_DEADLINE_S,
    GenerationSample,
    NodeLostSample,
    Pending,
    StreamEnded,
    TelemetryBatch,
    TelemetryCounters,
    TelemetryPreview,
    TelemetryStatus,
    admit,
    after_send,
    cleared,
    generation_sample,
    next_batch,
    node_lost_sample,
    send_result,
    telemetry_enabled,
)
from skulk.shared.ticks import until_tick_s
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.ids import NodeId

logger = logging.getLogger(__name__)

INSTALL_ID_WHAT: Final = "telemetry install id"

Post = Callable[[str, bytes], Awaitable[int]]
"""POST a JSON body to a URL within SEND_DEADLINE_S; the answer's status code (raises on no answer)."""


class TelemetryDisabledByEnv(Exception):
    """An operator tried to turn collection on where SKULK_TELEMETRY_DISABLE forbids it."""


class TelemetryConfigUnwritable(Exception):
    """skulk.yaml could not be read, parsed or written, so the switch was not changed."""


async def post_json(url: str, body: bytes) -> int:
    """One POST with the whole SEND_DEADLINE_S budget; no redirects followed."""
    async with asyncio.timeout(SEND_DEADLINE_S):
        async with httpx.AsyncClient(timeout=SEND_DEADLINE_S, follow_redirects=False) as client:
            response = await client.post(url, content=body, headers={"content-type": "application/json"})
            return response.status_code


class FieldTelemetry:
    """One node's collector and sender; `run` is its one task, started and cancelled with the node."""

    def __init__(
        self,
        section: TelemetrySection,
        *,
        env_disabled: bool,
        config_file: Path,
        install_id_file: Path,
        version: str,
        builtin_model_ids: frozenset[str],
        hardware_of: Callable[[], dict[NodeId, str | None]],
        serving_hardware: Callable[[StreamEnded, dict[NodeId, str | None]], list[str | None]],
        i_am_master: Callable[[], bool],
        post: Post = post_json,
    ) -> None:
        self._section = section
        self._env_disabled = env_disabled
        self._config_file = config_file
        self._install_id_file = install_id_file
        self._version = version
        self._builtin_model_ids = builtin_model_ids
        self._hardware_of = hardware_of
        """Every member's hardware class (`NodeResources.hardware_class`), by node id."""
        self._serving_hardware = serving_hardware
        self._i_am_master = i_am_master
        self._post = post
        self._consent: bool | None = None
        self._install_id: str | None = None
        self._pending = Pending()
        self._counters = TelemetryCounters()
        self._failing = False
        self._hook_errors = 0
        self._switch_lock = asyncio.Lock()

    # -- state --

    @property
    def enabled(self) -> bool:
        return telemetry_enabled(self._section.enabled, self._consent, self._env_disabled)

    def status(self) -> TelemetryStatus:
        return TelemetryStatus(
            enabled=self.enabled,
            consent=self._consent if self._consent is not None else self._section.enabled,
            disabled_by_env=self._env_disabled,
            endpoint=self._section.endpoint,
            flush_seconds=self._section.flush_seconds,
            install_id=self._install_id,
            pending=len(self._pending.samples),
            counters=self._counters,
        )

    def preview(self) -> TelemetryPreview:
        return TelemetryPreview(enabled=self.enabled, disabled_by_env=self._env_disabled,
                                endpoint=self._section.endpoint, batch=self._batch())

    def stats(self) -> dict[str, object]:
        """Depth, capacity, drops and sends for /v1/diagnostics/node."""
        status = self.status()
        return {"enabled": status.enabled, "pending": status.pending, "capacity": status.capacity,
                **self._counters.to_wire(), "hookErrors": self._hook_errors}

    def _batch(self) -> TelemetryBatch:
        return next_batch(self._pending, self._install_id, self._version)

    def _count(self, **changes: int) -> None:
        self._counters = self._counters.model_copy(
            update={k: getattr(self._counters, k) + v for k, v in changes.items()})

    # -- hooks (on the event loop, in other subsystems' paths: cheap, never raise) --

    def _queue(self, sample: GenerationSample | NodeLostSample | None) -> None:
        if sample is None:
            return
        before = self._pending.dropped
        self._pending = admit(self._pending, sample)
        if self._pending.dropped > before:
            self._count(dropped_samples=1)

    def on_stream_ended(self, ended: StreamEnded) -> None:
        """A command stream of this API node ended (`CommandStreams.on_ended`)."""
        if not self.enabled:
            return
        try:
            hardware = self._serving_hardware(ended, self._hardware_of())
            self._queue(generation_sample(ended, self._builtin_model_ids, hardware))
        except Exception as exc:  # a bug here must not touch the request
            self._hook_errors += 1
            logger.debug("field telemetry: a generation sample failed: %s", type(exc).__name__)

    def on_event_applied(self, indexed: IndexedEvent) -> None:
        """A replicated event applied (`StateReplica.on_applied`): a pruned member is counted."""
        if not self.enabled:
            return
        try:
            self._queue(node_lost_sample(indexed.event, self._i_am_master(), self._hardware_of()))
        except Exception as exc:
            self._hook_errors += 1
            logger.debug("field telemetry: a node-loss sample failed: %s", type(exc).__name__)

    # -- the switch --

    async def set_enabled(self, enabled: bool) -> TelemetryStatus:
        """The operator's switch: persisted in skulk.yaml first (so it survives a restart),
        then applied. Turning it on creates the install id; off drops what was collected."""
        if enabled and self._env_disabled:
            raise TelemetryDisabledByEnv("SKULK_TELEMETRY_DISABLE is set on this node: telemetry stays off "
                                         "until it is unset and the node restarted")
        async with self._switch_lock:
            await asyncio.to_thread(self._persist, enabled)
            if enabled:
                self._install_id = await asyncio.to_thread(self._ensure_install_id)
            self._consent = enabled
            if not enabled:
                self._pending = cleared(self._pending)
            logger.info("field telemetry turned %s by the operator", "on" if enabled else "off")
        return self.status()

    def _persist(self, enabled: bool) -> None:
        path = self._config_file
        try:
            text = path.read_text(encoding="utf-8") if path.exists() else ""
            edited = with_telemetry_enabled(text, enabled, path)
            if edited != text:
                mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else None
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, edited)
                if mode is not None:
                    path.chmod(mode)  # the operator's permissions, not the temporary file's 0600
        except ConfigError as exc:
            raise TelemetryConfigUnwritable(f"{path} is not a valid config now, so the switch was not saved: "
                                            f"{'; '.join(exc.problems)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise TelemetryConfigUnwritable(f"cannot save the switch in {path}: {getattr(exc, 'strerror', None) or exc}") from None

    def _ensure_install_id(self) -> str:
        try:
            install_id, created = load_or_create_secret(self._install_id_file, INSTALL_ID_WHAT)
        except SecretFileError as exc:
            raise TelemetryConfigUnwritable(str(exc)) from None
        if created:
            logger.info("field telemetry install id created in %s (docs/TELEMETRY.md: deletion)",
                        self._install_id_file.name)
        return install_id

    def _read_install_id(self) -> str | None:
        """The install id, created when collection is on (as at an opt-in), read when it exists."""
        try:
            if self.enabled:
                return self._ensure_install_id()
            if self._install_id_file.exists():
                return read_secret_file(self._install_id_file, INSTALL_ID_WHAT)
        except (TelemetryConfigUnwritable, SecretFileError) as exc:
            logger.info("field telemetry: no install id (%s); nothing is sent without one", type(exc).__name__)
        return None

    # -- the sender --

    async def run(self) -> None:
        """Flush every `flush_seconds` until cancelled with the node."""
        self._install_id = await asyncio.to_thread(self._read_install_id)
        loop = asyncio.get_running_loop()
        while True:
            # On the tick grid (`skulk.shared.ticks`): an idle node's wake-ups coincide.
            await asyncio.sleep(until_tick_s(loop.time(), self._section.flush_seconds))
            if self.enabled and self._install_id is None:
                self._install_id = await asyncio.to_thread(self._read_install_id)
            await self.flush()

    async def flush(self) -> None:
        """Send the next batch when collection is on and something is pending. Never raises
        (but for cancellation)."""
        if not self.enabled or not self._pending.samples or self._install_id is None:
            return
        batch, epoch = self._batch(), self._pending.epoch
        body = batch.model_dump_json(by_alias=True).encode()
        status: int | None
        try:
            status = await self._post(self._section.endpoint, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no answer: timeout, refused, no route, TLS
            status = None
            self._note_failure(type(exc).__name__)
        result = send_result(status)
        self._pending = after_send(self._pending, batch, result, epoch)
        if result == "sent":
            self._count(sent_batches=1, sent_samples=len(batch.samples))
            if self._failing:
                logger.info("field telemetry: sending works again")
            self._failing = False
            logger.debug("field telemetry: sent %d samples", len(batch.samples))
        elif result == "refused":
            self._count(refused_batches=1, dropped_samples=len(batch.samples))
            logger.info("field telemetry: the endpoint refused a batch of %d samples (HTTP %s); dropped",
                        len(batch.samples), status)
        else:
            self._count(failed_sends=1)
            if status is not None:
                self._note_failure(f"HTTP {status}")

    def _note_failure(self, why: str) -> None:
        if not self._failing:
            logger.info("field telemetry: sending failed (%s); samples wait for the next flush, bounded", why)
        else:
            logger.debug("field telemetry: sending failed again (%s)", why)
        self._failing = True


__all__ = ["FieldTelemetry", "Post", "TelemetryConfigUnwritable", "TelemetryDisabledByEnv", "post_json"]
