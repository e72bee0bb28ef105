# pyright: strict
"""This node's model artifacts: resolving a card to files on disk, and telling the cluster.

Why its own module: getting a model's files is a coordinator of its own (a route per card
source, downloads through the model store or straight from the hub, companion repos, the
download events and progress telemetry, failure cool-downs, staged-copy recency marks,
forgetting a copy the store evicted), and it used to live inline in the worker's shell
(`skulk.worker.main.Worker`), which now only wires it: it constructs `ArtifactDownloads`
with the callables and values it needs, starts a resolution when its plan says
`ResolveArtifact`, and reads what resolved and what failed for its view.

Decisions are pure functions over typed data, with table tests (tests/worker/test_downloads.py):

- `unavailable_failure` / `unexpected_failure`: an exception from resolving -> the failure
  record the plan reads (a passing download failure cools down, anything else stays).
- `failures_at`: which failures still hold at a time, and their reasons by model.
- `download_failure_reason`: the reason a DownloadFailed event carries.
- `progress_step`: whether a download's (done, total) sample is published now or throttled,
  and the reading that is published.
- `reports_completed`: whether a copy found on disk is reported DownloadCompleted.
- `completed_bytes`: the size a DownloadCompleted reports.
- `staging_in_use`: what staging one model must never evict.
- `staged_copy` / `forgets_on_eviction`: which staged copy a runner's path uses, and
  whether an eviction forgets a resolved path.

`ArtifactDownloads` below them only moves data: blocking work in threads, events to the
producer, readings to telemetry. The blocking downloads carry their own deadlines and stop
at the next chunk once `cancel()` is called (at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

from skulk.artifacts.plan import (
    ArtifactFailure,
    FailDownload,
    FailureCooldown,
    Route,
    after_staging_failure,
    live_failures,
    route_for,
    staged_dir,
    staging_failure_reason,
)
from skulk.artifacts.resolve import resolve_local_path
from skulk.model_store.eviction import in_use_model_ids
from skulk.model_store.fetch import stage_card
from skulk.model_store.node_store import StoreBinding
from skulk.model_store.staging import StagingFailed, mark_used
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.companions import companion_repo_ids, companions_of, ensure_companions
from skulk.models.downloads import (
    DownloadFailed,
    ProgressCallback,
    ProgressGate,
    download_model,
    gate_progress,
    local_artifact,
    local_size_bytes,
)
from skulk.models.tiny_models import ensure_generated
from skulk.routing.router import RouterError
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.events import DownloadCompleted, DownloadPending, Event
from skulk.shared.types.events import DownloadFailed as DownloadFailedEvent
from skulk.shared.types.ids import DownloadAttemptId, EventId, ModelId, NodeId, new_id
from skulk.shared.types.state import DownloadStatus, DownloadStatusCompleted, State
from skulk.shared.types.telemetry import DownloadProgress, TelemetryReading
from skulk.worker.staged_copies import eviction_applies

logger = logging.getLogger(__name__)


# -- pure decisions ------------------------------------------------------------------------


def unavailable_failure(exc: ArtifactUnavailable, cooldown: FailureCooldown, now: float) -> ArtifactFailure:
    """A model whose files cannot be had: a passing download failure (network, hub outage,
    shutdown) is forgotten at its retry time, so the next placement on this node downloads
    again instead of failing at once on a stale reason; any other stays."""
    kind = exc.kind if isinstance(exc, DownloadFailed) else None
    return ArtifactFailure(str(exc), cooldown.retry_at(kind, now))


def unexpected_failure(exc: BaseException) -> ArtifactFailure:
    """An error no artifact path expects (a bug, not a missing file): it never cools down."""
    return ArtifactFailure(f"{type(exc).__name__}: {exc}")


def failures_at(
    failures: Mapping[str, ArtifactFailure], now: float
) -> tuple[dict[str, ArtifactFailure], dict[ModelId, str]]:
    """The failures that still hold at `now` (an expired one is dropped for good), and their
    reasons by model, as the worker's plan reads them."""
    kept = live_failures(failures, now)
    return kept, {ModelId(model_id): failure.reason for model_id, failure in kept.items()}


def download_failure_reason(exc: BaseException) -> str:
    """What a DownloadFailed event says: the artifact error's own reason, else the error."""
    return exc.reason if isinstance(exc, ArtifactUnavailable) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Attempt:
    """One download attempt of one model on one node: what its events and readings name."""

    node_id: NodeId
    model_id: ModelId
    attempt_id: DownloadAttemptId


def progress_step(
    gate: ProgressGate, now: float, done: int, total: int, attempt: Attempt
) -> tuple[ProgressGate, DownloadProgress | None]:
    """A download's (done, total) sample at `now`: the gate after it, and the reading to
    publish now, or None when it is throttled (`models.downloads.gate_progress`)."""
    gate, due = gate_progress(gate, now, done, total)
    if not due:
        return gate, None
    return gate, DownloadProgress(node_id=attempt.node_id, model_id=attempt.model_id, attempt_id=attempt.attempt_id,
                                  downloaded_bytes=done, total_bytes=total)


def progress_key(reading: DownloadProgress) -> tuple[str, ModelId]:
    """A model's one latest-value slot in the node's telemetry outbox."""
    return ("download", reading.model_id)


def reports_completed(known: DownloadStatus | None) -> bool:
    """A copy found on disk is reported DownloadCompleted unless State already says so."""
    return not isinstance(known, DownloadStatusCompleted)


def completed_bytes(measured: int | None, otherwise: int) -> int:
    """The size a DownloadCompleted reports: what is on disk when it could be measured,
    else `otherwise` (the card's size for a found copy, the last total seen for a fresh one)."""
    return measured if measured is not None else otherwise


def staging_in_use(in_use: frozenset[str], card: ModelCard) -> frozenset[str]:
    """What staging `card` must never evict: what live runners use, plus this transaction's
    base model and its companions (staging one of them must never evict another)."""
    return in_use | {card.model_id} | companion_repo_ids(card)


def staged_copy(model_path: str, staging_root: Path | None) -> Path | None:
    """The staged copy a runner's model path lies in, or None (no store bound, or a path
    outside the staging root)."""
    return None if staging_root is None else staged_dir(Path(model_path), staging_root)


def forgets_on_eviction(path: str | None, staging_root: Path | None) -> bool:
    """Whether a StagedModelEvicted for a model no live runner uses forgets its resolved
    `path`: when there is one and it is (or may be) a staged copy; with no store bound
    (`staging_root` None) it may be, so it is forgotten and resolved again."""
    return path is not None and (staging_root is None or staged_dir(Path(path), staging_root) is not None)


# -- the shell -----------------------------------------------------------------------------


class ArtifactDownloads:
    """This node's resolved artifacts, those resolving, and those that failed; resolves a
    model when asked and reports every download to the cluster."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        models_dir: Path,
        cards: Callable[[], Mapping[ModelId, ModelCard]],
        state: Callable[[], State],
        submit: Callable[[Event], object],
        broadcast: Callable[[DownloadProgress], Awaitable[object]],
        spawn: Callable[[Awaitable[None]], None],
        wake: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        publish_telemetry: Callable[[Hashable, TelemetryReading], None] | None = None,
        store: Callable[[], StoreBinding | None] | None = None,
        store_api_key: str | None = None,
        disk_reserve_bytes: int | None = None,
    ) -> None:
        self._node_id = node_id
        self._models_dir = models_dir
        self._cards = cards
        self._state = state
        """The replica's State as it is now (read on the loop)."""
        self._submit = submit
        """Queue an event for the master (the node's event producer)."""
        self._broadcast = broadcast
        """Publish a reading on the telemetry topic (may raise RouterError)."""
        self._spawn = spawn
        """Run a coroutine in the background, held by the worker."""
        self._wake = wake
        """Ask the worker for a planning pass (a resolution ended)."""
        self._clock = clock
        self._publish_telemetry = publish_telemetry
        self._store = store
        """The model store binding as it is now (it follows the master): Hugging Face cards
        resolve through it; None (or a None binding) downloads straight into `models_dir`."""
        self._store_api_key = store_api_key
        self._disk_reserve_bytes = disk_reserve_bytes
        """Free space a direct hub download must leave on the models volume (skulk.yaml's
        disk_reserve_gb); None: the downloader's default (SKULK_DISK_RESERVE_GB, else 10 GiB)."""
        self._fallback_logged: set[str] = set()
        self._cancel = threading.Event()
        """Set at shutdown: a download thread stops at its next chunk instead of holding the
        process (the interpreter waits for executor threads) until the transfer ends."""
        self.artifacts: dict[ModelId, str] = {}
        """Model id -> the path its runners load."""
        self.companion_artifacts: dict[str, dict[str, str]] = {}
        """Model id -> its resolved companion repos' paths (repo id -> path), for the engines
        that load them (a drafter, split vision weights) and for diagnostics."""
        self.failures: dict[str, ArtifactFailure] = {}
        """Models whose files this node could not get, why, and until when (a passing
        failure is forgotten at its `retry_at`: `artifacts.plan.FailureCooldown`)."""
        self.failure_cooldown = FailureCooldown()
        self.resolving: set[ModelId] = set()

    # -- what the worker reads ---------------------------------------------------------------

    def failures_now(self) -> dict[ModelId, str]:
        """The artifact failures that still hold (expired ones are dropped for good)."""
        self.failures, reasons = failures_at(self.failures, self._clock())
        return reasons

    def retry_times(self) -> list[float | None]:
        """When each recorded failure stops counting (None: not on its own)."""
        return [failure.retry_at for failure in self.failures.values()]

    def stats(self) -> dict[str, object]:
        return {
            "artifacts": dict(self.artifacts),
            "companionArtifacts": {m: dict(c) for m, c in self.companion_artifacts.items()},
            "artifactFailures": self.failures_now(),
        }

    # -- resolving -------------------------------------------------------------------------

    def start(self, model_id: ModelId) -> None:
        """Resolve `model_id` in the background; it counts as resolving until that ends."""
        self.resolving.add(model_id)
        self._spawn(self.resolve(model_id))

    def cancel(self) -> None:
        """Stop every download at its next chunk (shutdown): each fails as cancelled."""
        self._cancel.set()

    async def resolve(self, model_id: ModelId) -> None:
        card = self._cards().get(model_id)
        try:
            if card is None:
                raise ArtifactUnavailable(model_id, "no model card")
            binding = self._store() if self._store is not None else None
            route = route_for(card, store_bound=binding is not None)
            if route is Route.GENERATE:
                path = await asyncio.to_thread(ensure_generated, card, self._models_dir)
            elif route is Route.LOCAL_PATH:
                path = await asyncio.to_thread(resolve_local_path, card)
            else:
                path = await self._download(card, binding)
            self.artifacts[model_id] = str(path)
        except ArtifactUnavailable as exc:
            # The runner that failed stays failed; the master's recovery re-places its
            # instance (`unavailable_failure` says when the node may try again).
            self.failures[model_id] = unavailable_failure(exc, self.failure_cooldown, self._clock())
        except Exception as exc:
            logger.exception("resolving model %s failed", model_id)
            self.failures[model_id] = unexpected_failure(exc)
        finally:
            self.resolving.discard(model_id)
            self._wake()

    async def _download(self, card: ModelCard, binding: StoreBinding | None) -> Path:
        """Obtain a hub card's artifact, telling the cluster: DownloadPending, throttled
        DownloadProgress telemetry, then DownloadCompleted or DownloadFailed (with the reason)
        under one attempt id. A copy already on disk is reported completed once, unless State
        already says so. Failures are re-raised for the runner-failure path.

        With a model store it is staged through the store (`store_fetch.stage_card`); a store
        this node cannot reach at all falls back to a direct hub download. Without one, the
        artifact downloads straight into the models dir.

        The card's companion repos (`companions.companion_download_specs`) resolve through the
        same path, on the fresh and the already-on-disk path alike, before the model is
        reported completed: a required one's failure fails the download, naming it."""
        if binding is None:
            def direct(companion: ModelCard) -> Path:
                return self._download_direct(companion, None)[0]  # a copy on disk is reused as is

            return await self._with_download_events(
                card, self._models_dir, lambda: local_artifact(card, self._models_dir),
                lambda on_progress: self._download_direct(card, on_progress),
                lambda: self._ensure_companions(card, direct))
        root = binding.store.staging_root

        def staged_locally(which: ModelCard) -> Path | None:
            found = local_artifact(which, root)
            staged = staged_dir(found, root) if found is not None else None
            if staged is not None:
                mark_used(staged)
            return found

        # Read on the loop, not in the thread (`staging_in_use`).
        in_use = staging_in_use(in_use_model_ids(self._state(), self._node_id, companions_of(self._cards)), card)

        def staged(companion: ModelCard) -> Path:
            found = staged_locally(companion)
            return found if found is not None else self._stage(binding, companion, in_use, None)[0]

        return await self._with_download_events(
            card, root, lambda: staged_locally(card),
            lambda on_progress: self._stage(binding, card, in_use, on_progress),
            lambda: self._ensure_companions(card, staged))

    def _ensure_companions(self, card: ModelCard, resolve: Callable[[ModelCard], Path]) -> None:
        """Companions through `resolve` (a worker thread); what resolved is kept per model."""
        resolved = ensure_companions(card, resolve)
        self.companion_artifacts[card.model_id] = {repo: str(path) for repo, path in resolved.items()}

    def _download_direct(self, card: ModelCard, on_progress: ProgressCallback | None) -> tuple[Path, int | None]:
        path = download_model(card, self._models_dir, on_progress=on_progress, cancel=self._cancel,
                              reserve_bytes=self._disk_reserve_bytes)
        return path, local_size_bytes(card, self._models_dir)

    def _stage(self, binding: StoreBinding, card: ModelCard, in_use: frozenset[str],
               on_progress: ProgressCallback | None) -> tuple[Path, int | None]:
        """Through the store (runs in a worker thread): the copy's path and its size."""
        try:
            path = stage_card(binding, card, in_use_model_ids=in_use, api_key=self._store_api_key,
                              on_progress=on_progress, cancel=self._cancel)
        except StagingFailed as exc:
            decision = after_staging_failure(exc.kind)
            if isinstance(decision, FailDownload):
                raise DownloadFailed(exc.model_id, staging_failure_reason(exc.reason), decision.kind) from exc
            if card.model_id not in self._fallback_logged:
                self._fallback_logged.add(card.model_id)
                logger.error(
                    "MODEL STORE UNREACHABLE: the store at %s (%s) did not answer this node (%s); downloading %s "
                    "directly from Hugging Face instead. Expected for a remote member with no route to the home "
                    "store; otherwise fix the route to the store host.",
                    binding.choice.address.base_url, binding.choice.source, exc.reason, card.model_id,
                )
            return self._download_direct(card, on_progress)
        return path, local_size_bytes(card, binding.store.staging_root)

    async def _with_download_events(
        self,
        card: ModelCard,
        root: Path,
        local: Callable[[], Path | None],
        fetch: Callable[[ProgressCallback], tuple[Path, int | None]],
        companions: Callable[[], object] = lambda: None,
    ) -> Path:
        """`companions` runs (in a thread) after the model itself resolved, on both paths, and
        before DownloadCompleted: a model is never reported ready without its required
        companions."""
        attempt = Attempt(NodeId(self._node_id), ModelId(card.model_id), DownloadAttemptId(new_id()))
        node_id, model_id, attempt_id = attempt.node_id, attempt.model_id, attempt.attempt_id

        def failed(exc: Exception) -> None:
            reason = download_failure_reason(exc)
            logger.warning("download of %s failed: %s", model_id, reason)
            self._submit(DownloadFailedEvent(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                             attempt_id=attempt_id, error_message=reason))

        found = await asyncio.to_thread(local)
        if found is not None:
            try:
                await asyncio.to_thread(companions)
            except Exception as exc:
                failed(exc)
                raise
            if reports_completed(self._state().downloads.get(node_id, {}).get(model_id)):
                size = await asyncio.to_thread(local_size_bytes, card, root)
                self._submit(DownloadCompleted(
                    event_id=EventId(new_id()), node_id=node_id, model_id=model_id, attempt_id=attempt_id,
                    total_bytes=completed_bytes(size, card.storage_size_bytes),
                ))
            return found
        self._submit(DownloadPending(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                     attempt_id=attempt_id))
        loop = asyncio.get_running_loop()
        gate = ProgressGate()
        seen_total = 0

        def on_progress(done: int, total: int) -> None:  # the download thread
            nonlocal gate, seen_total
            seen_total = total
            gate, reading = progress_step(gate, time.monotonic(), done, total, attempt)
            if reading is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed under a shutdown
                    loop.call_soon_threadsafe(self.publish_progress, reading)

        def fetch_all(progress: ProgressCallback) -> tuple[Path, int | None]:
            result = fetch(progress)
            companions()
            return result

        try:
            path, size = await asyncio.to_thread(fetch_all, on_progress)
        except Exception as exc:
            failed(exc)
            raise
        self._submit(DownloadCompleted(event_id=EventId(new_id()), node_id=node_id, model_id=model_id,
                                       attempt_id=attempt_id, total_bytes=completed_bytes(size, seen_total)))
        return path

    def publish_progress(self, reading: DownloadProgress) -> None:
        """Download progress is telemetry, never an event: the master skips DownloadOngoing at
        its source and the producer would hold and resend every sample until a later event
        confirmed it. Through the node's telemetry outbox when wired, else straight onto the
        telemetry topic (latest-value: a lost sample is superseded by the next)."""
        if self._publish_telemetry is not None:
            self._publish_telemetry(progress_key(reading), reading)
            return

        async def send() -> None:
            try:
                await self._broadcast(reading)
            except RouterError as exc:
                logger.debug("download progress not published: %s", exc)

        self._spawn(send())

    # -- staged copies ---------------------------------------------------------------------

    def mark_staged_use(self, model_path: str) -> None:
        """A runner loads a staged copy: record the use (the recency pass's clock). Blocking
        (a file's timestamp): call it in a thread."""
        binding = self._store() if self._store is not None else None
        if binding is None:
            return
        staged = staged_copy(model_path, binding.store.staging_root)
        if staged is not None:
            with contextlib.suppress(OSError):
                mark_used(staged)

    def forget_evicted(self, indexed: object) -> None:
        """A StagedModelEvicted for this node: its staged copy is (about to be) gone unless a
        live runner uses it, so the resolved path is forgotten and the next placement
        resolves the model again. (A replica listener, on the loop.)"""
        model_id = eviction_applies(getattr(indexed, "event", None), self._node_id)
        if model_id is None or model_id in in_use_model_ids(self._state(), self._node_id,
                                                            companions_of(self._cards)):
            return
        binding = self._store() if self._store is not None else None
        root = binding.store.staging_root if binding is not None else None
        if forgets_on_eviction(self.artifacts.get(model_id), root):
            del self.artifacts[model_id]


__all__ = [
    "ArtifactDownloads",
    "Attempt",
    "completed_bytes",
    "download_failure_reason",
    "failures_at",
    "forgets_on_eviction",
    "progress_key",
    "progress_step",
    "reports_completed",
    "staged_copy",
    "staging_in_use",
    "unavailable_failure",
    "unexpected_failure",
]
