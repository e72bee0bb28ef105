"""When the store lacks a model: the store host fetches it from Hugging Face into its
canonical models dir, and the node that asked stages from the store once it is registered.
The store stays the single source of truth, and the hub sees each model once per cluster.

- `StoreFetcher` (store host): one background hub download per model directory, however
  many nodes ask; a caller polls `request` until the copy is registered or the fetch
  failed (a failure is remembered for `FAILURE_TTL_S`, so every poller hears it, then the
  next request tries again).
- `request_fetch` (staging node): `POST /store/models/{modelId}/fetch` on the store host,
  polled with a deadline; a store that never answers is `unreachable` (the worker's cue for
  its direct-download fallback), a failed hub fetch is the hub's typed `DownloadFailed`.
- `stage_card`: the whole resolution of a Hugging Face card through the store, whichever
  node hosts it. Blocking: call it from a thread.

Wire shape of the fetch route's answer (`FetchStatus.to_json`): `{"state": "registered" |
"fetching" | "failed", "modelId", "revision", "downloadedBytes", "totalBytes", "reason",
"kind", "manifest"}`, with 200 (registered), 202 (fetching) or 502 (failed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from skulk.model_store.node_store import StoreBinding, find_registered, stage_model
from skulk.model_store.staging import REQUEST_TIMEOUT_S, Manifest, RetryPolicy, StagingFailed, manifest_from_marker
from skulk.models.downloads import DownloadFailed, ProgressCallback, download_model, local_artifact, model_dir_for
from skulk.shared.types.cards import ModelCard

logger = logging.getLogger(__name__)

FAILURE_TTL_S = 30.0
"""How long a failed hub fetch is reported to pollers before a new request retries it."""
POLL_INTERVAL_S = 1.0
FETCH_DEADLINE_S = 12 * 3600.0
"""A whole store-side fetch, as a staging node waits for it: generous, but finite."""
MAX_CONSECUTIVE_TRANSPORT_ERRORS = 5
"""A store that stops answering this many polls in a row is unreachable."""

FetchState = Literal["registered", "fetching", "failed"]


@dataclass(frozen=True)
class FetchStatus:
    state: FetchState
    model_id: str
    revision: str | None = None
    downloaded_bytes: int = 0
    total_bytes: int = 0
    reason: str | None = None
    kind: str | None = None
    manifest: Manifest | None = None

    @property
    def http_status(self) -> int:
        return {"registered": 200, "fetching": 202, "failed": 502}[self.state]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state, "modelId": self.model_id, "revision": self.revision,
            "downloadedBytes": self.downloaded_bytes, "totalBytes": self.total_bytes, "reason": self.reason,
            "kind": self.kind, "manifest": self.manifest.to_json() if self.manifest is not None else None,
        }


@dataclass
class _Job:
    model_id: str
    revision: str | None
    downloaded_bytes: int = 0
    total_bytes: int = 0
    done: bool = False
    failure: DownloadFailed | None = None
    ended_s: float = 0.0


Downloader = Callable[..., Path]


@dataclass
class StoreFetcher:
    """The store host's hub fetches on behalf of staging nodes (thread-safe)."""

    download: Downloader = download_model
    clock: Callable[[], float] = time.monotonic
    _jobs: dict[str, _Job] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set at shutdown: a fetch stops at its next chunk (the partial download resumes later)."""
    reserve_bytes: int | None = None
    """Free space every canonical download must leave on the store's volume (the node's
    `disk_reserve_gb`); None: the downloader's default (SKULK_DISK_RESERVE_GB, else 10 GiB)."""
    free_bytes: Callable[[Path], int] | None = None
    """Measures the store's volume (None: the real disk)."""

    def request(self, card: ModelCard, canonical_root: Path) -> FetchStatus:
        """Registered, fetching (started now or earlier) or failed. Blocking disk reads:
        call it from a thread."""
        key = model_dir_for(card, canonical_root).name
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.done:
                return FetchStatus("fetching", card.model_id, card.source_revision, job.downloaded_bytes,
                                   job.total_bytes)
            if job is not None and job.failure is not None and self.clock() - job.ended_s < FAILURE_TTL_S:
                return FetchStatus("failed", card.model_id, card.source_revision, reason=job.failure.reason,
                                   kind=job.failure.kind)
        if local_artifact(card, canonical_root) is not None:
            marker = find_registered(canonical_root, card.model_id, card.source_revision)
            if marker is not None:
                return FetchStatus("registered", card.model_id, card.source_revision,
                                   manifest=manifest_from_marker(marker))
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.done:
                job = _Job(card.model_id, card.source_revision)
                self._jobs[key] = job
                threading.Thread(target=self._run, args=(job, card, canonical_root), daemon=True,
                                 name=f"store-fetch-{key}").start()
                logger.info("store: fetching %s from the hub for a staging node", card.model_id)
            return FetchStatus("fetching", card.model_id, card.source_revision, job.downloaded_bytes,
                               job.total_bytes)

    def _run(self, job: _Job, card: ModelCard, canonical_root: Path) -> None:
        def progress(done: int, total: int) -> None:
            job.downloaded_bytes, job.total_bytes = done, total

        failure: DownloadFailed | None = None
        disk: dict[str, Any] = {}
        if self.reserve_bytes is not None:
            disk["reserve_bytes"] = self.reserve_bytes
        if self.free_bytes is not None:
            disk["free_bytes"] = self.free_bytes
        try:
            self.download(card, canonical_root, on_progress=progress, cancel=self.cancel, **disk)
        except DownloadFailed as exc:
            failure = exc
        except Exception as exc:
            logger.exception("store: fetching %s failed", card.model_id)
            failure = DownloadFailed(card.model_id, f"{type(exc).__name__}: {exc}", "error")
        if failure is not None:
            logger.warning("store: fetching %s from the hub failed: %s", card.model_id, failure.reason)
        with self._lock:
            job.failure, job.done, job.ended_s = failure, True, self.clock()


# ---------------------------------------------------------------------------------------
# The staging node's side
# ---------------------------------------------------------------------------------------


def request_fetch(
    base_url: str,
    card: ModelCard,
    *,
    api_key: str | None = None,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    poll_s: float = POLL_INTERVAL_S,
    deadline_s: float = FETCH_DEADLINE_S,
    transport: httpx.BaseTransport | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Manifest | None:
    """Ask the store host to fetch `card`'s artifact from the hub and wait until it is
    registered. Raises StagingFailed (`unreachable`, `deadline`, `cancelled`, `transfer`)
    or the store host's DownloadFailed (the hub's answer, with its kind)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"/store/models/{quote(card.model_id, safe='/')}/fetch"
    # Unset optional fields are left out, so a store host whose card schema predates one of
    # them (companion repos, say) still accepts a card that does not use it.
    body = {"revision": card.source_revision, "card": card.model_dump(mode="json", by_alias=True, exclude_none=True)}
    deadline = clock() + deadline_s
    transport_errors = 0
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=REQUEST_TIMEOUT_S,
                      transport=transport) as http:
        while True:
            if cancel is not None and cancel.is_set():
                raise StagingFailed(card.model_id, "the fetch was cancelled", "cancelled")
            if clock() > deadline:
                raise StagingFailed(card.model_id, f"the store did not fetch it within {deadline_s:.0f} s", "deadline")
            try:
                response = http.post(url, json=body)
            except httpx.TransportError as exc:
                transport_errors += 1
                if transport_errors >= MAX_CONSECUTIVE_TRANSPORT_ERRORS:
                    raise StagingFailed(card.model_id, f"the store is unreachable: {exc}", "unreachable") from exc
                sleep(poll_s)
                continue
            transport_errors = 0
            try:
                answer = response.json()
            except ValueError:
                answer = {}
            state = answer.get("state") if isinstance(answer, dict) else None
            if response.status_code == 200 and state == "registered":
                manifest = answer.get("manifest")
                return Manifest.from_json(manifest) if manifest else None
            if response.status_code == 202 and state == "fetching":
                if on_progress is not None and answer.get("totalBytes"):
                    on_progress(int(answer.get("downloadedBytes") or 0), int(answer["totalBytes"]))
                sleep(poll_s)
                continue
            if state == "failed":
                raise DownloadFailed(card.model_id, f"the store host could not fetch it: {answer.get('reason')}",
                                     answer.get("kind") or "error")
            if response.status_code >= 500:
                transport_errors += 1
                if transport_errors >= MAX_CONSECUTIVE_TRANSPORT_ERRORS:
                    raise StagingFailed(card.model_id, f"the store answered {response.status_code}", "transfer")
                sleep(poll_s)
                continue
            raise StagingFailed(card.model_id, f"the store refused the fetch ({response.status_code}): "
                                f"{response.text[:300]}", "not_found" if response.status_code == 404 else "transfer")


def stage_card(
    binding: StoreBinding,
    card: ModelCard,
    *,
    in_use_model_ids: frozenset[str] = frozenset(),
    api_key: str | None = None,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    retry: RetryPolicy = RetryPolicy(),
    fetch_poll_s: float = POLL_INTERVAL_S,
) -> Path:
    """The card's artifact path inside this node's staged copy, obtained through the store:

    - on the store host, a missing model is downloaded from the hub into the canonical
      models dir first, then staged by hardlink (no extra disk);
    - elsewhere the copy is transferred from the store host; when the store lacks it (or
      lacks this card's files, e.g. another quant), the store host is asked to fetch it from
      the hub first.

    Raises StagingFailed (kind `unreachable`: the caller's cue for a direct download) or
    DownloadFailed (the hub's answer). Blocking: call it from a thread."""
    store, choice = binding.store, binding.choice
    revision = card.source_revision

    def stage() -> Path | None:
        stage_model(store, choice, card.model_id, revision=revision, in_use_model_ids=in_use_model_ids,
                    api_key=api_key, retry=retry, cancel=cancel, on_progress=on_progress)
        return local_artifact(card, store.staging_root)

    if choice.is_self:
        if store.canonical_root is None:
            raise StagingFailed(card.model_id, "this node hosts the store but has no canonical models dir", "invalid")
        # The canonical copy is never evicted: the download's own disk admission guards it.
        download_model(card, store.canonical_root, on_progress=on_progress, cancel=cancel,
                       reserve_bytes=store.policy.reserve_bytes, free_bytes=store.free_bytes)
        artifact = stage()
    else:
        try:
            artifact = stage()
        except StagingFailed as exc:
            if exc.kind != "not_found":
                raise
            artifact = None
        if artifact is None:
            request_fetch(choice.address.base_url, card, api_key=api_key, on_progress=on_progress, cancel=cancel,
                          poll_s=fetch_poll_s)
            artifact = stage()
    if artifact is None:
        raise StagingFailed(card.model_id, "the staged copy lacks the card's files", "not_found")
    return artifact


__all__ = [
    "FAILURE_TTL_S",
    "FetchStatus",
    "StoreFetcher",
    "request_fetch",
    "stage_card",
]
