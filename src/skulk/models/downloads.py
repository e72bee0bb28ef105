"""Downloading a Hugging Face card's artifact into the node's models directory.

The imperative half of downloads (`hub_files` decides *which* files, purely). One call,
`download_model`, turns a huggingface card into a path an engine loads, through
`huggingface_hub` (which honours HF_ENDPOINT and HF_TOKEN; both are read from the
environment at call time, so a test's mock hub or an operator's mirror takes effect
without re-importing anything):

- identity: the repo listing is read once per attempt at the card's `source_revision` (or
  main) and every byte is fetched at the commit that listing names, so one download never
  mixes two revisions. A pinned card lives in a revision-qualified directory
  (`paths.hub_model_dir_name`) whose marker must carry the pin; anything else there is the
  wrong artifact and is replaced, but only after the pinned revision fully downloaded (a
  failed fetch never destroys the previous copy).
- resumable transfers: bytes land in a staging directory beside the target, in a partial
  file named by the file's etag; a cut body is resumed with a Range request by
  huggingface_hub's `http_get` within the attempt, and a later attempt or process (a retry,
  a node restart, a second `skulk models pull`) resumes the same partial file and skips the
  files already finished. tests/models/test_downloads.py cuts and cancels transfers and
  checks the resumed Range requests.
- typed failure: 401/403 (private or gated repo, bad token) and 404 (unknown repo, revision
  or file) end at once as `DownloadFailed` naming the reason; transient failures (network,
  5xx, 429, a cut connection) are retried with capped exponential backoff, at most
  `RetryPolicy.max_attempts` times per step and never past `RetryPolicy.deadline_s`.
- progress: `on_progress(downloaded_bytes, total_bytes)` from the downloading thread, for
  the CLI's progress bar and the worker's telemetry (the worker throttles it).
- disk reserve: once the exact file set is known, the bytes still to fetch (finished and
  resumable data credited) must fit the volume's free space with the operating-system
  reserve left over (`disk_admission.admit`), or the download fails as `DownloadFailed`
  (kind `disk`) with the arithmetic, before any byte is written. Admission and transfer run
  under one per-models-dir lock, so concurrent downloads cannot spend the same free bytes.
  This is the only guard for the store's canonical copy and the direct fallback: nothing
  there is ever evicted.

This module never decides placement or emits events; the worker and the CLI do.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from skulk.datadir.atomic_file import write_atomic
from skulk.datadir.file_lock import LockFailure, exclusive_file_lock
from skulk.datadir.paths import hub_model_dir_name
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.disk_admission import admit, disk_free_bytes, reserve_bytes_from_env
from skulk.models.hub_files import RepoFile, SelectionError, select_files, total_size_bytes
from skulk.shared.types.cards import ModelCard

logger = logging.getLogger(__name__)

MARKER_FILE_NAME = "skulk-download.json"
"""Written last into a completed model directory: model id, revision (the commit the bytes
came from), whether it was pinned, and every downloaded file with its size."""
PARTIAL_DIR_NAME = ".skulk-partial"
"""Inside a staging directory: files being transferred, named '<path>.<etag>.incomplete'."""
HASH_CHUNK_BYTES = 8 * 1024 * 1024
STAGING_REVISION_FILE = ".skulk-staging-revision"
"""Names the commit a staging directory's finished files belong to; a staging directory of
another commit is discarded rather than mixed in."""

DOWNLOAD_LOCK_TIMEOUT_S = 3600.0
"""Longest a caller waits for another process downloading the same model into the same
models dir (two nodes sharing a cache). Past it the caller fails loudly instead of hanging."""
LOCK_POLL_INTERVAL_S = 0.2
VOLUME_LOCK_FILE = ".skulk-volume.lock"
"""In a models dir: held from disk admission to the end of the transfer, so two downloads
into one volume never admit against the same free bytes (one transfer at a time per dir)."""
METADATA_TIMEOUT_S = 15.0
"""Per-request timeout of the repo listing and of each file's metadata (HEAD) request."""

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
"""An etag of this shape is the file's sha256 (the hub's LFS files); the bytes are checked."""

ProgressCallback = Callable[[int, int], None]
FailureKind = Literal[
    "not_found", "unauthorized", "revision_mismatch", "no_files", "transient", "deadline", "cancelled", "disk", "error"
]


@dataclass(frozen=True)
class HubSource:
    """Where the hub is and who we are to it. None = huggingface_hub's own default (its
    endpoint constant; its token lookup: HF_TOKEN, then a `hf auth login` token file)."""

    endpoint: str | None = None
    token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HubSource:
        env = os.environ if env is None else env
        endpoint = (env.get("HF_ENDPOINT") or "").rstrip("/") or None
        return cls(endpoint=endpoint, token=env.get("HF_TOKEN") or None)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on retrying transient failures. Each step (the listing, each file) gets
    `max_attempts`; the whole download gets `deadline_s`."""

    max_attempts: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 16.0
    deadline_s: float = 12 * 3600.0
    """A whole download's deadline: generous (a 100 GB model over a slow link), but finite,
    so a stalled transfer ends as a typed failure instead of a forever-'downloading' node."""


def backoff_delay_s(attempt: int, policy: RetryPolicy) -> float:
    """Wait before retry number `attempt` (1-based): base * 2^(attempt-1), capped."""
    return min(policy.max_delay_s, policy.base_delay_s * (2 ** max(0, attempt - 1)))


class DownloadFailed(ArtifactUnavailable):
    """A download that ended without the artifact: which model, why (for the operator, and
    the DownloadFailed event), and a `kind` callers can branch on."""

    def __init__(self, model_id: str, reason: str, kind: FailureKind = "error") -> None:
        super().__init__(model_id, reason)
        self.kind: FailureKind = kind
        self.args = (model_id, reason, kind)  # rebuilds it when pickled across processes

    def __str__(self) -> str:
        return f"downloading {self.model_id} failed ({self.kind}): {self.reason}"


# ---------------------------------------------------------------------------------------
# Classifying failures (pure)
# ---------------------------------------------------------------------------------------


def _transport_errors() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError")):
        try:
            types.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(types)


_TRANSPORT_ERRORS = _transport_errors()


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def classify_error(exc: BaseException) -> tuple[bool, FailureKind, str]:
    """(retryable, kind, reason) for an exception raised while talking to the hub.

    Permanent: the hub answered and the answer will not change by asking again (no such
    repo/revision/file, not allowed). Transient: the network or the hub's health. Anything
    unrecognised is permanent: retrying an unknown bug only delays its report."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    status = _status_of(exc)
    if isinstance(exc, GatedRepoError):
        return False, "unauthorized", "the repository is gated: accept its terms on the hub and set HF_TOKEN"
    if isinstance(exc, RevisionNotFoundError):
        return False, "not_found", "the revision does not exist in the repository (404)"
    if isinstance(exc, RepositoryNotFoundError):
        if status == 401:
            return False, "unauthorized", "the repository does not exist or is private: check the id, or set HF_TOKEN (401)"
        return False, "not_found", f"the repository does not exist on the hub ({status or 404})"
    if isinstance(exc, HfHubHTTPError) and status is not None:
        if status in (401, 403):
            return False, "unauthorized", f"the hub refused access ({status}): set HF_TOKEN to a token with access"
        if status == 404:
            return False, "not_found", "the hub has no such file (404)"
        if status in (408, 429) or status >= 500:
            return True, "transient", f"the hub answered {status}"
        return False, "error", f"the hub answered {status}: {exc}"
    if isinstance(exc, LocalEntryNotFoundError):
        # huggingface_hub wraps the failed metadata request: classify what it wrapped.
        cause = exc.__cause__ or exc.__context__
        if cause is not None and cause is not exc:
            return classify_error(cause)
        return True, "transient", f"the hub could not be reached: {exc}"
    if isinstance(exc, _TRANSPORT_ERRORS):
        return True, "transient", f"network error: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        if exc.errno == 28:  # ENOSPC
            return False, "disk", f"the models volume is full: {exc}"
        # huggingface_hub's size-consistency check after a short body is an OSError.
        return True, "transient", f"{type(exc).__name__}: {exc}"
    return False, "error", f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------

PROGRESS_INTERVAL_S = 1.0
"""Least time between two progress samples a subscriber passes on (the worker's telemetry):
byte callbacks arrive per 10 MiB chunk or faster, far more often than anyone reads them."""


@dataclass(frozen=True)
class ProgressGate:
    """What was last let through: when, and how many bytes."""

    last_emit_s: float | None = None
    last_bytes: int = -1


def gate_progress(
    gate: ProgressGate, now: float, done: int, total: int, min_interval_s: float = PROGRESS_INTERVAL_S
) -> tuple[ProgressGate, bool]:
    """Whether to pass a (done, total) sample on: only forward motion (a resumed transfer can
    report fewer bytes than before), at most one per `min_interval_s`, and always the final
    one, so a subscriber never ends on a stale fraction."""
    if done <= gate.last_bytes:
        return gate, False
    if done >= total or gate.last_emit_s is None or now - gate.last_emit_s >= min_interval_s:
        return ProgressGate(now, done), True
    return gate, False



class _Meter:
    """Sums per-file progress into one (done, total) stream and enforces the stop rules
    (cancel, deadline) from inside the transfer loop, where bytes arrive: the DownloadFailed
    it raises there passes through huggingface_hub, which only catches network errors."""

    def __init__(
        self,
        model_id: str,
        total_bytes: int,
        on_progress: ProgressCallback | None,
        deadline: float,
        cancel: threading.Event | None,
        clock: Callable[[], float],
    ) -> None:
        self.model_id = model_id
        self.total_bytes = total_bytes
        self.finished_bytes = 0
        self.current_bytes = 0
        self._on_progress = on_progress
        self._deadline = deadline
        self._cancel = cancel
        self._clock = clock

    def check(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise DownloadFailed(self.model_id, "the download was cancelled", "cancelled")
        if self._clock() > self._deadline:
            raise DownloadFailed(self.model_id, "the download ran past its deadline", "deadline")

    def emit(self) -> None:
        if self._on_progress is not None:
            done = min(self.finished_bytes + max(self.current_bytes, 0), self.total_bytes)
            self._on_progress(done, self.total_bytes)

    def advance(self, n: int) -> None:
        self.current_bytes += n
        self.check()
        self.emit()

    def file_done(self, size_bytes: int) -> None:
        self.finished_bytes += size_bytes
        self.current_bytes = 0
        self.emit()

    def bar_class(self) -> Callable[..., _FileBar]:
        """What huggingface_hub instantiates as its per-file progress bar (`tqdm_class`)."""

        def make(*_args: Any, initial: int = 0, **_kwargs: Any) -> _FileBar:
            self.current_bytes = initial
            return _FileBar(self)

        return make


class _FileBar:
    """The slice of tqdm's interface huggingface_hub's transfer uses (a context manager with
    `update`); it forwards byte counts to the meter and draws nothing."""

    def __init__(self, meter: _Meter) -> None:
        self._meter = meter

    def __enter__(self) -> _FileBar:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def update(self, n: int | float = 1) -> None:
        # Negative when the server ignored a Range request and the transfer restarts at 0.
        self._meter.advance(int(n))

    def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------
# Markers and local state
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownloadMarker:
    model_id: str
    revision: str
    pinned: bool
    files: Mapping[str, int]
    """Repo-relative path -> size in bytes."""

    def to_json(self) -> dict[str, Any]:
        return {"modelId": self.model_id, "revision": self.revision, "pinned": self.pinned, "files": dict(self.files)}


def read_marker(model_dir: Path) -> DownloadMarker | None:
    try:
        raw = json.loads((model_dir / MARKER_FILE_NAME).read_text(encoding="utf-8"))
        return DownloadMarker(
            model_id=str(raw["modelId"]), revision=str(raw["revision"]), pinned=bool(raw["pinned"]),
            files={str(k): int(v) for k, v in dict(raw["files"]).items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def model_dir_for(card: ModelCard, models_dir: Path) -> Path:
    return Path(models_dir) / hub_model_dir_name(card.model_id, card.source_revision)


def _artifact_path(card: ModelCard, model_dir: Path) -> Path:
    if card.is_gguf:
        assert card.gguf_file is not None  # the card schema requires it for hub GGUF cards
        return model_dir / card.gguf_file
    if card.onnx_file is not None:  # the card schema requires it for hub ONNX cards
        return model_dir / card.onnx_file
    return model_dir


def _present(model_dir: Path, files: Mapping[str, int], wanted: tuple[str, ...]) -> bool:
    for path in wanted:
        local = model_dir / path
        if path not in files or not local.is_file() or local.stat().st_size != files[path]:
            return False
    return True


def local_artifact(card: ModelCard, models_dir: Path) -> Path | None:
    """The card's artifact path when a complete copy is already on disk, else None. Never
    touches the network: a complete copy of a pinned card is final, and a main-branch copy
    is reused as downloaded (the marker says which commit it is)."""
    model_dir = model_dir_for(card, models_dir)
    marker = read_marker(model_dir)
    if marker is None or marker.model_id != card.model_id:
        return None
    if card.source_revision is not None and marker.revision != card.source_revision:
        return None  # a pinned directory with any other revision is the wrong artifact
    listing = [RepoFile(path, size) for path, size in marker.files.items()]
    try:
        wanted = select_files(card.model_id, card.artifact_format, listing, card.gguf_file, onnx_file=card.onnx_file)
    except SelectionError:
        return None  # e.g. another quant of the repo than the one on disk
    return _artifact_path(card, model_dir) if _present(model_dir, marker.files, wanted) else None


def local_size_bytes(card: ModelCard, models_dir: Path) -> int | None:
    """Bytes of the card's files in its complete local copy (only this card's quant when the
    directory holds several), or None without one."""
    marker = read_marker(model_dir_for(card, models_dir))
    if marker is None or local_artifact(card, models_dir) is None:
        return None
    listing = [RepoFile(path, size) for path, size in marker.files.items()]
    return total_size_bytes(listing, select_files(card.model_id, card.artifact_format, listing, card.gguf_file,
                                                  onnx_file=card.onnx_file))


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path, model_id: str, timeout_s: float,
                    cancel: threading.Event | None = None) -> Iterator[None]:
    """`file_lock.exclusive_file_lock` failing as this model's DownloadFailed."""

    def fail(kind: LockFailure, message: str) -> DownloadFailed:
        return DownloadFailed(model_id, "the download was cancelled" if kind == "cancelled" else message, kind)

    with exclusive_file_lock(lock_path, timeout_s, fail, poll_s=LOCK_POLL_INTERVAL_S, cancel=cancel):
        yield


# ---------------------------------------------------------------------------------------
# The download
# ---------------------------------------------------------------------------------------


@dataclass
class _Attempts:
    model_id: str
    policy: RetryPolicy
    deadline: float
    cancel: threading.Event | None
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def run(self, what: str, op: Callable[[], Any]) -> Any:
        """`op()` with transient failures retried under the policy; a permanent failure or
        an exhausted budget ends as DownloadFailed naming `what` failed."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return op()
            except DownloadFailed:
                raise
            except Exception as exc:
                retryable, kind, reason = classify_error(exc)
                if not retryable:
                    raise DownloadFailed(self.model_id, f"{what}: {reason}", kind) from exc
                if attempt >= self.policy.max_attempts:
                    raise DownloadFailed(
                        self.model_id, f"{what}: {reason} (gave up after {attempt} attempts)", "transient"
                    ) from exc
                delay = backoff_delay_s(attempt, self.policy)
                if self.clock() + delay > self.deadline:
                    raise DownloadFailed(self.model_id, f"{what}: {reason} (deadline reached)", "deadline") from exc
                logger.warning("%s of %s failed (%s); retry %d in %.1f s", what, self.model_id, reason, attempt, delay)
                if self.cancel is not None:
                    if self.cancel.wait(delay):
                        raise DownloadFailed(self.model_id, "the download was cancelled", "cancelled") from exc
                else:
                    self.sleep(delay)


def _repo_listing(card: ModelCard, hub: HubSource) -> tuple[str, list[RepoFile]]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    info = api.model_info(
        card.model_id, revision=card.source_revision or "main", files_metadata=True, timeout=METADATA_TIMEOUT_S
    )
    if not info.sha:
        raise DownloadFailed(card.model_id, "the hub's listing names no commit for this revision", "error")
    files = [RepoFile(s.rfilename, s.size) for s in (info.siblings or [])]
    return info.sha, files


def _same_origin(a: str, b: str) -> bool:
    ua, ub = urlsplit(a), urlsplit(b)
    return (ua.scheme, ua.netloc) == (ub.scheme, ub.netloc)


def _fetch_file(repo_id: str, path: str, revision: str, staging: Path, hub: HubSource, meter: _Meter) -> None:
    """One file into `staging/path`, resuming a partial copy left by an earlier attempt or
    process. huggingface_hub's own hf_hub_download resumes only within one call (it writes
    each attempt to a fresh temporary file and deletes it on failure), so the transfer is
    driven here with its building blocks: the metadata request (etag, size, CDN location)
    and `http_get`, which sends `Range: bytes=<have>-` and retries cut bodies itself. The
    partial file is named by the file's etag, so bytes of a changed file are never resumed."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import get_hf_file_metadata, http_get
    from huggingface_hub.utils import build_hf_headers

    final = staging / path
    if final.is_file():
        return  # finished by an earlier attempt at this same commit (the staging stamp says so)
    url = hf_hub_url(repo_id, path, revision=revision, endpoint=hub.endpoint)
    meta = get_hf_file_metadata(url, token=hub.token, timeout=METADATA_TIMEOUT_S, endpoint=hub.endpoint)
    if meta.etag is None:
        raise DownloadFailed(repo_id, f"the hub sent no ETag for {path}", "error")
    headers = build_hf_headers(token=hub.token)
    if not _same_origin(url, meta.location):
        headers.pop("authorization", None)  # a signed CDN URL: never hand it our token
    partial = staging / PARTIAL_DIR_NAME / f"{path.replace('/', '--')}.{meta.etag}.incomplete"
    partial.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("ab") as handle:
        have = handle.tell()
        if meta.size is not None and have > meta.size:
            handle.truncate(0)
            have = 0
        http_get(meta.location, handle, resume_size=have, headers=headers, expected_size=meta.size,
                 displayed_filename=path, tqdm_class=meter.bar_class())  # type: ignore[arg-type]
    if _SHA256_RE.match(meta.etag) and _sha256_of(partial) != meta.etag:
        partial.unlink(missing_ok=True)  # corrupt: start over (a transient failure, retried)
        raise OSError(f"{path}: content does not match its sha256 {meta.etag}")
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _present_sizes(
    selected: tuple[str, ...], revision: str, target: Path, existing: DownloadMarker | None, extend: bool,
    staging: Path,
) -> dict[str, int]:
    """Bytes each selected file already has on disk: in the target (same commit), finished
    in the staging dir, or a resumable partial there (only when the staging dir is of this
    commit: another commit's is discarded, so it credits nothing)."""
    out: dict[str, int] = {}
    try:
        same_commit = (staging / STAGING_REVISION_FILE).read_text(encoding="utf-8").strip() == revision
    except OSError:
        same_commit = False
    for path in selected:
        if extend and existing is not None and _present(target, existing.files, (path,)):
            out[path] = existing.files[path]
            continue
        if not same_commit:
            continue
        with contextlib.suppress(OSError):
            out[path] = (staging / path).stat().st_size
            continue
        for partial in (staging / PARTIAL_DIR_NAME).glob(f"{glob.escape(path.replace('/', '--'))}.*.incomplete"):
            with contextlib.suppress(OSError):
                out[path] = max(out.get(path, 0), partial.stat().st_size)
    return out


def prepare_revision_dir(staging: Path, revision: str) -> None:
    """A staging directory holds finished files of one commit; another commit's are dropped.
    Shared by hub downloads and store staging (`skulk.model_store.staging`)."""
    stamp = staging / STAGING_REVISION_FILE
    if staging.exists():
        try:
            same = stamp.read_text(encoding="utf-8").strip() == revision
        except OSError:
            same = False
        if not same:
            shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    stamp.write_text(revision, encoding="utf-8")


def swap_into_place(staging: Path, target: Path) -> None:
    """Rename the finished staging directory onto the target; an older target (another
    revision) is moved aside first and removed after."""
    if target.exists():
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale-"))
        os.replace(target, aside / "old")
        os.replace(staging, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staging, target)


def download_model(
    card: ModelCard,
    models_dir: Path,
    *,
    hub: HubSource | None = None,
    on_progress: ProgressCallback | None = None,
    policy: RetryPolicy = RetryPolicy(),
    cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    reserve_bytes: int | None = None,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
) -> Path:
    """The card's artifact under `models_dir`, downloading what is missing. Blocking: call it
    from a thread. Raises DownloadFailed (an ArtifactUnavailable) with the reason.

    `reserve_bytes` is the free space the download must leave on the models volume (None:
    SKULK_DISK_RESERVE_GB, else 10 GiB); `free_bytes` measures that volume."""
    if card.source != "huggingface":
        raise ArtifactUnavailable(card.model_id, f"not a Hugging Face card (source {card.source!r})")
    hub = hub or HubSource.from_env()
    models_dir = Path(models_dir)
    target = model_dir_for(card, models_dir)
    found = local_artifact(card, models_dir)
    if found is not None:
        return found
    if reserve_bytes is None:
        try:
            reserve_bytes = reserve_bytes_from_env(os.environ)
        except ValueError as exc:
            raise DownloadFailed(card.model_id, str(exc), "error") from None
    models_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models_dir / f".{target.name}.lock", card.model_id, DOWNLOAD_LOCK_TIMEOUT_S):
        found = local_artifact(card, models_dir)  # another process may have finished meanwhile
        if found is not None:
            return found
        with _exclusive_lock(models_dir / VOLUME_LOCK_FILE, card.model_id, DOWNLOAD_LOCK_TIMEOUT_S, cancel):
            return _download_locked(card, models_dir, target, hub, on_progress, policy, cancel, clock, sleep,
                                    reserve_bytes, free_bytes)


def _download_locked(
    card: ModelCard, models_dir: Path, target: Path, hub: HubSource, on_progress: ProgressCallback | None,
    policy: RetryPolicy, cancel: threading.Event | None, clock: Callable[[], float], sleep: Callable[[float], None],
    reserve_bytes: int, free_bytes: Callable[[Path], int],
) -> Path:
    """The download proper, under the model's lock and the volume's admission lock."""
    attempts = _Attempts(card.model_id, policy, clock() + policy.deadline_s, cancel, clock, sleep)
    revision, listing = attempts.run("reading the repository listing", lambda: _repo_listing(card, hub))
    if card.source_revision is not None and revision != card.source_revision:
        raise DownloadFailed(
            card.model_id, f"the hub served commit {revision} for pinned revision {card.source_revision}",
            "revision_mismatch",
        )
    try:
        selected = select_files(card.model_id, card.artifact_format, listing, card.gguf_file, onnx_file=card.onnx_file)
    except SelectionError as exc:
        raise DownloadFailed(card.model_id, exc.reason, "no_files") from exc
    sizes = {f.path: f.size_bytes or 0 for f in listing}
    existing = read_marker(target)
    # Same commit already on disk (another quant of the repo): add to it in place.
    extend = existing is not None and existing.revision == revision and existing.model_id == card.model_id
    meter = _Meter(card.model_id, total_size_bytes(listing, selected), on_progress, attempts.deadline, cancel, clock)
    staging = models_dir / f".{target.name}.partial"
    verdict = admit({p: sizes[p] for p in selected}, _present_sizes(selected, revision, target, existing, extend,
                                                                    staging), free_bytes(models_dir), reserve_bytes)
    if not verdict.fits:
        logger.error("refusing to download %s: %s", card.model_id, verdict.reason(models_dir))
        raise DownloadFailed(card.model_id, verdict.reason(models_dir), "disk")
    prepare_revision_dir(staging, revision)
    logger.info("downloading %s at %s: %d files, %d bytes", card.model_id, revision[:12], len(selected),
                meter.total_bytes)
    meter.emit()
    fetched: list[str] = []
    for path in selected:
        meter.check()
        if extend and _present(target, existing.files, (path,)):  # type: ignore[union-attr]
            meter.file_done(sizes[path])
            continue
        attempts.run(f"downloading {path}",
                     lambda path=path: _fetch_file(card.model_id, path, revision, staging, hub, meter))
        fetched.append(path)
        meter.file_done(sizes[path])
    shutil.rmtree(staging / PARTIAL_DIR_NAME, ignore_errors=True)
    (staging / STAGING_REVISION_FILE).unlink(missing_ok=True)
    files = {p: (staging / p).stat().st_size for p in fetched}
    if extend:
        assert existing is not None
        for path in fetched:
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / path, target / path)
        marker = DownloadMarker(card.model_id, revision, card.source_revision is not None,
                                {**existing.files, **files})
        _write_json_atomic(target / MARKER_FILE_NAME, marker.to_json())
        shutil.rmtree(staging, ignore_errors=True)
    else:
        marker = DownloadMarker(card.model_id, revision, card.source_revision is not None, files)
        _write_json_atomic(staging / MARKER_FILE_NAME, marker.to_json())
        swap_into_place(staging, target)
    logger.info("downloaded %s at %s into %s", card.model_id, revision[:12], target)
    return _artifact_path(card, target)


def remove_model(models_dir: Path, model_id: str) -> list[Path]:
    """Delete every local copy of `model_id` (main and pinned revisions, unfinished staging).
    Returns what was removed; an empty list when nothing was there."""
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        return []
    base = hub_model_dir_name(model_id, None)
    removed = []
    for entry in sorted(models_dir.iterdir()):
        name = entry.name
        bare = name[1:].removesuffix(".partial") if name.startswith(".") and name.endswith(".partial") else name
        if entry.is_dir() and (bare == base or bare.startswith(base + "@")):
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


def downloaded_models(models_dir: Path) -> dict[str, list[DownloadMarker]]:
    """Complete downloads under `models_dir` by model id (one marker per revision on disk)."""
    out: dict[str, list[DownloadMarker]] = {}
    if not Path(models_dir).is_dir():
        return out
    for entry in sorted(Path(models_dir).iterdir()):
        marker = read_marker(entry) if entry.is_dir() and not entry.name.startswith(".") else None
        if marker is not None:
            out.setdefault(marker.model_id, []).append(marker)
    return out


__all__ = [
    "MARKER_FILE_NAME",
    "PROGRESS_INTERVAL_S",
    "VOLUME_LOCK_FILE",
    "DownloadFailed",
    "DownloadMarker",
    "HubSource",
    "ProgressCallback",
    "ProgressGate",
    "RetryPolicy",
    "backoff_delay_s",
    "classify_error",
    "download_model",
    "downloaded_models",
    "gate_progress",
    "local_artifact",
    "local_size_bytes",
    "model_dir_for",
    "read_marker",
    "remove_model",
]
