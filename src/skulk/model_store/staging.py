"""Staging a model's registered file set from the model store into this node's staging dir.

The store holds each model's canonical copy (a complete download under the store host's
models dir, its `skulk-download.json` marker listing every file and the commit it came
from). A node loads from its own staged copy, which is a cache the node may delete; the
canonical copy is the cluster's source of truth and this module never deletes it.

- On the store host, staging hardlinks every file (`os.link`): store files are immutable
  once registered and staged files are never written in place, so the staged copy costs
  no extra disk. A filesystem that cannot link (another volume, no hardlink support) gets
  a real copy instead.
- From a remote store, each file comes over HTTP with Range requests that resume from the
  bytes already on disk; its size is checked against the manifest before it is renamed
  into place.
- Either way the copy is assembled in a hidden `.<name>.partial` directory stamped with the
  revision, its marker is written last, and the directory is renamed into place: a reader
  never sees a half-staged model, and a failed transfer never destroys the previous copy.
- Capacity admission (how many new bytes, what to evict for them, see `eviction.py`) and
  the transfer run under one per-staging-root lock, so concurrent launches cannot spend the
  same free bytes.

The staged copy carries the same marker format as a download (`skulk.models.downloads`), so
`downloads.local_artifact(card, staging_root)` resolves a staged model like a downloaded one.
Every wait has a deadline. Every transfer buffer is one network read (httpx's
`iter_bytes()` without a chunk size: at most its 64 KiB read), written to disk as it
arrives, so a cut connection loses nothing that was received.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import quote

import httpx

from skulk.datadir.atomic_file import write_atomic
from skulk.datadir.file_lock import LockFailure, exclusive_file_lock
from skulk.datadir.paths import hub_model_dir_name
from skulk.model_store.eviction import EvictionPlan, EvictionPolicy, StagedCopy, plan_eviction
from skulk.models.disk_admission import disk_free_bytes
from skulk.models.downloads import (
    MARKER_FILE_NAME,
    STAGING_REVISION_FILE,
    DownloadMarker,
    prepare_revision_dir,
    read_marker,
    swap_into_place,
)

logger = logging.getLogger(__name__)

STAGING_DIR_NAME = "staging"
"""Per-node staging root under the node's data dir (not the models dir, which nodes on one
machine may share): one node's eviction must never delete a copy another node's runner uses."""
LAST_USED_FILE = ".skulk-last-used"
"""Its mtime is when a runner last used the staged copy (the recency pass's clock)."""
REVISION_STAMP_FILE = STAGING_REVISION_FILE
"""Names the commit a `.partial` directory's finished files belong to; another commit's
partial files are discarded, never mixed in."""
ADMISSION_LOCK_FILE = ".admission.lock"

REQUEST_TIMEOUT_S = 30.0
"""Connect/read timeout of each store request: a stalled store ends as a retry, not a hang."""
ADMISSION_LOCK_TIMEOUT_S = 3600.0
"""Longest a staging waits for another staging into the same root (it holds the lock for a
whole transfer). Past it the staging fails loudly instead of hanging."""
LOCK_POLL_S = 0.2

FailureKind = Literal[
    "not_found", "unreachable", "disk", "size_mismatch", "transfer", "deadline", "cancelled", "invalid"
]
"""`unreachable`: the store never answered (the caller may fall back to a direct download
and log the topology problem); `not_found`: the store answered that it lacks the model."""


class StagingFailed(Exception):
    """A staging that ended without a usable copy: which model, why, and a `kind`."""

    def __init__(self, model_id: str, reason: str, kind: FailureKind = "transfer") -> None:
        super().__init__(model_id, reason, kind)
        self.model_id = model_id
        self.reason = reason
        self.kind = kind

    def __str__(self) -> str:
        return f"staging {self.model_id} failed ({self.kind}): {self.reason}"


# ---------------------------------------------------------------------------------------
# The manifest: a registered artifact's exact file set (pure)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size_bytes: int


@dataclass(frozen=True)
class Manifest:
    """What the store registered for one model at one revision."""

    model_id: str
    revision: str
    pinned: bool
    files: tuple[ManifestFile, ...]

    @property
    def dir_name(self) -> str:
        return hub_model_dir_name(self.model_id, self.revision if self.pinned else None)

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "modelId": self.model_id, "revision": self.revision, "pinned": self.pinned, "dirName": self.dir_name,
            "totalBytes": self.total_bytes,
            "files": [{"path": f.path, "sizeBytes": f.size_bytes} for f in self.files],
        }

    @classmethod
    def from_json(cls, raw: Any) -> Manifest:
        """Parse and validate a store's answer: a path that could escape the staging dir
        is refused, whoever sent it."""
        try:
            files = tuple(ManifestFile(str(f["path"]), int(f["sizeBytes"])) for f in raw["files"])
            manifest = cls(str(raw["modelId"]), str(raw["revision"]), bool(raw["pinned"]), files)
        except (KeyError, TypeError, ValueError) as exc:
            raise StagingFailed(str(raw.get("modelId", "?")) if isinstance(raw, dict) else "?",
                                f"the store sent a malformed manifest: {exc!r}", "invalid") from None
        for f in files:
            if not is_safe_relative(f.path) or f.size_bytes < 0:
                raise StagingFailed(manifest.model_id, f"the manifest names an unsafe file {f.path!r}", "invalid")
        return manifest


def manifest_from_marker(marker: DownloadMarker) -> Manifest:
    files = tuple(ManifestFile(p, s) for p, s in sorted(marker.files.items()))
    return Manifest(marker.model_id, marker.revision, marker.pinned, files)


def is_safe_relative(path: str) -> bool:
    """A repo-relative POSIX path that stays inside its directory: no absolute path, no '..',
    no empty or '.' segment, no backslash or NUL, and never one of our own marker files."""
    if not path or "\\" in path or "\x00" in path or path.startswith("/"):
        return False
    parts = PurePosixPath(path).parts
    if any(p in ("", ".", "..") for p in path.split("/")) or not parts:
        return False
    return parts[-1] not in (MARKER_FILE_NAME, LAST_USED_FILE, REVISION_STAMP_FILE)


def additional_bytes(manifest: Manifest, present_sizes: Mapping[str, int], hardlinks: bool) -> int:
    """Bytes the staging still has to write: resumable data already on disk is credited,
    and hardlinks into a same-filesystem store add nothing."""
    if hardlinks:
        return 0
    return sum(max(0, f.size_bytes - min(present_sizes.get(f.path, 0), f.size_bytes)) for f in manifest.files)


# ---------------------------------------------------------------------------------------
# Reading the staging root
# ---------------------------------------------------------------------------------------


def staging_root_for(data_home: Path) -> Path:
    return Path(data_home) / STAGING_DIR_NAME


def is_complete(model_dir: Path, manifest: Manifest) -> bool:
    """A finished copy of exactly this revision: marker matches, every file the right size."""
    marker = read_marker(model_dir)
    if marker is None or marker.model_id != manifest.model_id or marker.revision != manifest.revision:
        return False
    for f in manifest.files:
        local = model_dir / f.path
        try:
            if local.stat().st_size != f.size_bytes:
                return False
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class StagedEntry:
    """One finished staged copy on disk."""

    dir_name: str
    path: Path
    model_id: str
    revision: str
    logical_bytes: int
    """Sum of its file sizes."""
    own_bytes: int
    """Bytes deleting it frees: files whose only link is this copy (hardlinks into the store
    are shared blocks and free nothing)."""
    last_used_s: float
    """Wall-clock seconds (file mtime) of the last use."""


def _measure(model_dir: Path, marker: DownloadMarker) -> tuple[int, int]:
    logical = own = 0
    for rel in marker.files:
        try:
            st = (model_dir / rel).stat()
        except OSError:
            continue
        logical += st.st_size
        if st.st_nlink <= 1:
            own += st.st_size
    return logical, own


def scan_staged(staging_root: Path) -> list[StagedEntry]:
    """Every finished staged copy under `staging_root` (hidden partials excluded)."""
    root = Path(staging_root)
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        marker = read_marker(entry)
        if marker is None:
            continue
        logical, own = _measure(entry, marker)
        try:
            last_used = (entry / LAST_USED_FILE).stat().st_mtime
        except OSError:
            last_used = (entry / MARKER_FILE_NAME).stat().st_mtime
        out.append(StagedEntry(entry.name, entry, marker.model_id, marker.revision, logical, own, last_used))
    return out


def partial_bytes(staging_root: Path) -> int:
    """Bytes held by unfinished `.partial` directories (resumable data)."""
    total = 0
    for entry in Path(staging_root).glob(".*.partial"):
        for dirpath, _dirs, files in os.walk(entry):
            for name in files:
                with contextlib.suppress(OSError):
                    total += (Path(dirpath) / name).stat().st_size
    return total


def mark_used(model_dir: Path, now_s: float | None = None) -> None:
    """Record a use of a staged copy (a runner loaded it); the recency pass reads it."""
    stamp = Path(model_dir) / LAST_USED_FILE
    stamp.touch(exist_ok=True)
    if now_s is not None:
        os.utime(stamp, (now_s, now_s))


def to_copies(entries: Iterable[StagedEntry], in_use_model_ids: frozenset[str]) -> list[StagedCopy]:
    return [StagedCopy(e.dir_name, e.own_bytes, e.last_used_s, in_use=e.model_id in in_use_model_ids)
            for e in entries]


# ---------------------------------------------------------------------------------------
# Deleting staged copies (never the canonical copy)
# ---------------------------------------------------------------------------------------


class CanonicalPathRefused(Exception):
    """A delete aimed at or into the store's canonical models dir: a bug, refused."""


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def remove_staged_dir(staging_root: Path, dir_name: str, canonical_root: Path | None) -> Path | None:
    """Delete one staged copy by directory name; None when it was not there."""
    if not dir_name or "/" in dir_name or dir_name in (".", "..") or dir_name.startswith("."):
        raise ValueError(f"not a staged directory name: {dir_name!r}")
    target = Path(staging_root) / dir_name
    if canonical_root is not None and (_inside(target, canonical_root) or _inside(canonical_root, target)):
        raise CanonicalPathRefused(f"{target} overlaps the store's canonical models dir {canonical_root}")
    if not target.is_dir():
        return None
    # Move aside first: the name disappears atomically, so nothing loads a half-deleted copy.
    aside = Path(staging_root) / f".{dir_name}.deleting-{os.getpid()}-{threading.get_ident()}"
    os.replace(target, aside)
    shutil.rmtree(aside, ignore_errors=True)
    return target


@dataclass(frozen=True)
class RemovalResult:
    removed: tuple[str, ...] = ()
    """Directory names deleted."""
    kept_in_use: tuple[str, ...] = ()
    """Directory names kept because a live runner uses the model."""
    freed_bytes: int = 0


def remove_staged(
    staging_root: Path,
    in_use_model_ids: frozenset[str],
    canonical_root: Path | None,
    model_id: str | None = None,
) -> RemovalResult:
    """Delete the staged copies of `model_id` (every revision), or of every model when None,
    except those a live runner uses. Unfinished partials of those models go too."""
    removed: list[str] = []
    kept: list[str] = []
    freed = 0
    for entry in scan_staged(staging_root):
        if model_id is not None and entry.model_id != model_id:
            continue
        if entry.model_id in in_use_model_ids:
            kept.append(entry.dir_name)
            continue
        if remove_staged_dir(staging_root, entry.dir_name, canonical_root) is not None:
            removed.append(entry.dir_name)
            freed += entry.own_bytes
    if Path(staging_root).is_dir():
        _remove_idle_partials(Path(staging_root), model_id)
    return RemovalResult(tuple(removed), tuple(kept), freed)


def _remove_idle_partials(staging_root: Path, model_id: str | None) -> None:
    """Unfinished partials of `model_id` (all when None), but only while no staging holds
    the admission lock: an active transaction's partial is its resumable data."""
    fd = os.open(staging_root / ADMISSION_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a staging is running; its partial stays, the next purge takes it
        base = None if model_id is None else hub_model_dir_name(model_id, None)
        for partial in staging_root.glob(".*.partial"):
            bare = partial.name[1:].removesuffix(".partial")
            if base is None or bare == base or bare.startswith(base + "@"):
                shutil.rmtree(partial, ignore_errors=True)
    finally:
        os.close(fd)


def apply_recency(
    staging_root: Path,
    policy: EvictionPolicy,
    in_use_model_ids: frozenset[str],
    canonical_root: Path | None,
    free_bytes: Callable[[Path], int] | None = None,
) -> RemovalResult:
    """The recency pass (instance deactivation, node startup): idle copies beyond the grace
    budget go. Also reconciles copies orphaned by a crashed session."""
    if not policy.cleanup_on_deactivate:
        return RemovalResult()
    entries = scan_staged(staging_root)
    free = (free_bytes or disk_free_bytes)(Path(staging_root)) if Path(staging_root).exists() else 0
    plan = plan_eviction(to_copies(entries, in_use_model_ids), policy, free)
    return _carry_out(staging_root, plan, entries, canonical_root)


def _carry_out(staging_root: Path, plan: EvictionPlan, entries: list[StagedEntry],
               canonical_root: Path | None) -> RemovalResult:
    by_name = {e.dir_name: e for e in entries}
    removed, freed = [], 0
    for name in plan.evict:
        if remove_staged_dir(staging_root, name, canonical_root) is not None:
            removed.append(name)
            freed += by_name[name].own_bytes
            logger.info("evicted staged copy %s (%d bytes)", name, by_name[name].own_bytes)
    return RemovalResult(tuple(removed), (), freed)


# ---------------------------------------------------------------------------------------
# Assembling a copy
# ---------------------------------------------------------------------------------------

_NO_LINK_ERRNOS = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES})
"""os.link failures that mean "this filesystem (pair) cannot link", answered with a copy."""


def link_or_copy(src: Path, dst: Path) -> Literal["link", "copy"]:
    """Hardlink `src` to `dst`; a real copy (written beside, renamed into place) when the
    filesystem cannot link. An existing `dst` is replaced."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        dst.unlink()
    try:
        os.link(src, dst)
        return "link"
    except OSError as exc:
        if exc.errno not in _NO_LINK_ERRNOS:
            raise
    tmp = dst.with_name(dst.name + ".copying")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return "copy"


def _write_marker(model_dir: Path, manifest: Manifest) -> None:
    marker = DownloadMarker(manifest.model_id, manifest.revision, manifest.pinned,
                            {f.path: f.size_bytes for f in manifest.files})
    write_atomic(model_dir / MARKER_FILE_NAME, json.dumps(marker.to_json(), indent=2, sort_keys=True))


def _finish(partial: Path, target: Path, manifest: Manifest, now_s: float | None) -> None:
    """Marker last, then the directory into place; an older copy is moved aside first and
    removed after, so the name never points at a half-made copy."""
    (partial / REVISION_STAMP_FILE).unlink(missing_ok=True)
    for f in manifest.files:
        try:
            size = (partial / f.path).stat().st_size
        except OSError:
            size = -1
        if size != f.size_bytes:
            raise StagingFailed(manifest.model_id, f"{f.path} is {size} bytes, the store registered {f.size_bytes}",
                                "size_mismatch")
    _write_marker(partial, manifest)
    mark_used(partial, now_s)
    swap_into_place(partial, target)


def _present_sizes(partial: Path, manifest: Manifest) -> dict[str, int]:
    """Bytes already on disk per file in a partial directory (finished or resumable)."""
    out: dict[str, int] = {}
    for f in manifest.files:
        for candidate in (partial / f.path, partial / (f.path + ".part")):
            with contextlib.suppress(OSError):
                out[f.path] = max(out.get(f.path, 0), candidate.stat().st_size)
    return out


@contextlib.contextmanager
def admission_lock(staging_root: Path, model_id: str, timeout_s: float = ADMISSION_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Serialises capacity admission plus transfer per staging root, across threads and
    processes (flock on one descriptor per call), with a deadline."""
    Path(staging_root).mkdir(parents=True, exist_ok=True)

    def fail(_kind: LockFailure, _message: str) -> StagingFailed:  # no cancel: only the deadline ends the wait
        return StagingFailed(model_id, f"another staging held {staging_root} for over {timeout_s:.0f} s", "deadline")

    with exclusive_file_lock(Path(staging_root) / ADMISSION_LOCK_FILE, timeout_s, fail, poll_s=LOCK_POLL_S):
        yield


@dataclass(frozen=True)
class StagingOptions:
    policy: EvictionPolicy = EvictionPolicy()
    in_use_model_ids: frozenset[str] = frozenset()
    """Live runners' models and companions, plus the other models of this transaction."""
    canonical_root: Path | None = None
    """The store's canonical models dir when this node hosts the store: never evicted."""
    free_bytes: Callable[[Path], int] = field(default=disk_free_bytes)
    now_s: float | None = None
    """Stamp for the copy's last use (None: the file system's clock)."""


def _admit(staging_root: Path, manifest: Manifest, pending: int, options: StagingOptions) -> None:
    """The disk-safety trigger: evict idle copies until `pending` fits with the reserve."""
    entries = scan_staged(staging_root)
    in_use = options.in_use_model_ids | {manifest.model_id}
    copies = [c for c in to_copies(entries, in_use) if c.key != manifest.dir_name]
    plan = plan_eviction(copies, options.policy, options.free_bytes(Path(staging_root)), pending)
    if not plan.fits:
        raise StagingFailed(
            manifest.model_id,
            f"not enough disk: {pending} more bytes plus a {options.policy.reserve_bytes}-byte reserve needs "
            f"{plan.needed_bytes}, only {plan.available_bytes} can be freed (short by {plan.shortfall_bytes})",
            "disk",
        )
    _carry_out(staging_root, plan, entries, options.canonical_root)


def stage_from_local(
    canonical_dir: Path, manifest: Manifest, staging_root: Path, options: StagingOptions = StagingOptions()
) -> Path:
    """Stage from the store on this node: hardlink every registered file (copy where the
    filesystem cannot link). Returns the staged directory."""
    root = Path(staging_root)
    target = root / manifest.dir_name
    if is_complete(target, manifest):
        mark_used(target, options.now_s)
        return target
    for f in manifest.files:
        if not (canonical_dir / f.path).is_file():
            raise StagingFailed(manifest.model_id, f"the store's copy lacks {f.path}", "not_found")
    with admission_lock(root, manifest.model_id):
        if is_complete(target, manifest):
            mark_used(target, options.now_s)
            return target
        partial = root / f".{manifest.dir_name}.partial"
        prepare_revision_dir(partial, manifest.revision)
        # Links cost nothing; where they fail, every missing byte is copied.
        links = _can_link(canonical_dir, manifest, partial)
        _admit(root, manifest, additional_bytes(manifest, _present_sizes(partial, manifest), links), options)
        modes = {link_or_copy(canonical_dir / f.path, partial / f.path) for f in manifest.files}
        _finish(partial, target, manifest, options.now_s)
    logger.info("staged %s at %s from the local store (%s)", manifest.model_id, manifest.revision[:12],
                "+".join(sorted(modes)) or "empty")
    return target


def _can_link(canonical_dir: Path, manifest: Manifest, partial: Path) -> bool:
    """Whether this filesystem pair links, asked the only reliable way: by linking one
    registered file (comparing st_dev misses filesystems that refuse links)."""
    if not manifest.files:
        return True
    probe = partial / ".link-probe"
    probe.unlink(missing_ok=True)
    try:
        os.link(canonical_dir / manifest.files[0].path, probe)
    except OSError as exc:
        if exc.errno in _NO_LINK_ERRNOS:
            return False
        raise
    probe.unlink()
    return True


# ---------------------------------------------------------------------------------------
# From a remote store over HTTP
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    """Per file (and for the manifest)."""
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    deadline_s: float = 12 * 3600.0
    """A whole staging's deadline: generous for a large model on a slow link, but finite."""


class _Transient(Exception):
    """A failure worth retrying; `unreachable` when no connection to the store was made."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class StoreClient:
    """The store's HTTP surface, as a staging node calls it (blocking: run in a thread)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                    transport=transport)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def manifest(self, model_id: str, revision: str | None = None) -> Manifest:
        params = {"revision": revision} if revision else None
        try:
            response = self._client.get(f"/store/models/{quote(model_id, safe='/')}", params=params)
        except httpx.TransportError as exc:
            raise _Transient(f"the store is unreachable: {exc}", unreachable=True) from exc
        if response.status_code == 404:
            raise StagingFailed(model_id, "the store has no registered copy", "not_found")
        if response.status_code >= 500:
            raise _Transient(f"the store answered {response.status_code}")
        if response.status_code != 200:
            raise StagingFailed(model_id, f"the store answered {response.status_code}: {response.text[:200]}",
                                "transfer")
        return Manifest.from_json(response.json())

    def fetch(self, manifest: Manifest, file: ManifestFile, part: Path, check: Callable[[], None],
              on_bytes: Callable[[int], None] = lambda _have: None) -> None:
        """Bring `part` up to the file's full size, resuming from what it holds.
        `on_bytes(have)` reports the bytes the file holds after each write."""
        have = part.stat().st_size if part.exists() else 0
        if have > file.size_bytes:
            part.unlink()
            have = 0
        if have == file.size_bytes:
            return
        headers = {"Range": f"bytes={have}-"} if have else {}
        url = f"/store/artifacts/{quote(manifest.dir_name, safe='')}/{quote(file.path, safe='/')}"
        try:
            with self._client.stream("GET", url, headers=headers) as response:
                status = response.status_code
                if status == 404:
                    raise StagingFailed(manifest.model_id, f"the store has no {file.path}", "not_found")
                if status >= 500:
                    raise _Transient(f"the store answered {status} for {file.path}")
                if status == 416:  # our partial does not match the store's file: start over
                    part.unlink(missing_ok=True)
                    raise _Transient(f"range not satisfiable for {file.path}")
                if status not in (200, 206):
                    raise StagingFailed(manifest.model_id, f"the store answered {status} for {file.path}", "transfer")
                if status == 200:
                    have = 0  # the store ignored the Range: the body is the whole file
                elif not response.headers.get("content-range", "").startswith(f"bytes {have}-"):
                    raise _Transient(f"the store resumed {file.path} at the wrong offset")
                part.parent.mkdir(parents=True, exist_ok=True)
                with open(part, "r+b" if have else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in response.iter_bytes():  # no chunk_size: never held back to fill one
                        check()
                        have += len(chunk)
                        if have > file.size_bytes:
                            raise StagingFailed(manifest.model_id, f"the store sent more than {file.size_bytes} "
                                                f"bytes for {file.path}", "size_mismatch")
                        out.write(chunk)
                        on_bytes(have)
        except httpx.TransportError as exc:
            raise _Transient(f"transfer of {file.path} broke: {exc}") from exc
        if have != file.size_bytes:
            raise _Transient(f"{file.path} ended at {have} of {file.size_bytes} bytes")


ProgressCallback = Callable[[int, int], None]
"""`(staged_bytes, total_bytes)`, as downloads report it: the worker gates and publishes it as
DownloadProgress telemetry under the attempt's id, so /state and the CLI see staging move."""


class _StagingMeter:
    """One (done, total) stream over a staging's files: bytes already on disk count from the
    start, each file's progress replaces its own previous figure. A running sum, so a chunk
    costs O(1) however many files the manifest has."""

    def __init__(self, manifest: Manifest, present: Mapping[str, int], on_progress: ProgressCallback | None) -> None:
        self._have = {f.path: min(max(present.get(f.path, 0), 0), f.size_bytes) for f in manifest.files}
        self._done = sum(self._have.values())
        self.total = manifest.total_bytes
        self._on_progress = on_progress

    def file_at(self, path: str, have: int) -> None:
        self._done += have - self._have.get(path, 0)
        self._have[path] = have
        self.emit()

    def emit(self) -> None:
        if self._on_progress is not None:
            self._on_progress(max(0, min(self._done, self.total)), self.total)


def _with_retries(model_id: str, what: str, op: Callable[[], Any], policy: RetryPolicy, deadline: float,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> Any:
    attempt = 0
    while True:
        attempt += 1
        try:
            return op()
        except _Transient as exc:
            if attempt >= policy.max_attempts:
                kind: FailureKind = "unreachable" if exc.unreachable else "transfer"
                raise StagingFailed(model_id, f"{what}: {exc} (gave up after {attempt} attempts)", kind) from exc
            delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
            if clock() + delay > deadline:
                raise StagingFailed(model_id, f"{what}: {exc} (deadline reached)", "deadline") from exc
            logger.warning("%s of %s failed (%s); retry %d in %.1f s", what, model_id, exc, attempt, delay)
            sleep(delay)


def stage_from_remote(
    client: StoreClient,
    model_id: str,
    staging_root: Path,
    options: StagingOptions = StagingOptions(),
    *,
    revision: str | None = None,
    retry: RetryPolicy = RetryPolicy(),
    cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """Stage `model_id` from a remote store: manifest, admission, resumable per-file
    transfers with size checks, then the atomic rename. Returns the staged directory.
    `on_progress` gets (bytes staged, manifest total) from this thread as bytes land, the
    resumed ones included; the caller throttles it (the worker's progress gate)."""
    deadline = clock() + retry.deadline_s
    manifest: Manifest = _with_retries(model_id, "reading the manifest", lambda: client.manifest(model_id, revision),
                                       retry, deadline, clock, sleep)
    if manifest.model_id != model_id or (revision is not None and manifest.revision != revision):
        raise StagingFailed(model_id, f"the store answered with {manifest.model_id} at {manifest.revision}", "invalid")
    root = Path(staging_root)
    target = root / manifest.dir_name
    if is_complete(target, manifest):
        mark_used(target, options.now_s)
        return target

    def check() -> None:
        if cancel is not None and cancel.is_set():
            raise StagingFailed(model_id, "the staging was cancelled", "cancelled")
        if clock() > deadline:
            raise StagingFailed(model_id, "the staging ran past its deadline", "deadline")

    with admission_lock(root, model_id):
        if is_complete(target, manifest):
            mark_used(target, options.now_s)
            return target
        partial = root / f".{manifest.dir_name}.partial"
        prepare_revision_dir(partial, manifest.revision)
        present = _present_sizes(partial, manifest)
        _admit(root, manifest, additional_bytes(manifest, present, False), options)
        meter = _StagingMeter(manifest, present, on_progress)
        meter.emit()
        for f in manifest.files:
            check()
            final = partial / f.path
            if final.is_file() and final.stat().st_size == f.size_bytes:
                continue  # finished by an earlier, interrupted attempt
            part = partial / (f.path + ".part")
            _with_retries(model_id, f"fetching {f.path}",
                          lambda f=f, part=part: client.fetch(manifest, f, part, check,
                                                              lambda have, f=f: meter.file_at(f.path, have)),
                          retry, deadline, clock, sleep)
            os.replace(part, final)
        _finish(partial, target, manifest, options.now_s)
        meter.emit()
    logger.info("staged %s at %s from the store (%d files, %d bytes)", model_id, manifest.revision[:12],
                len(manifest.files), manifest.total_bytes)
    return target


__all__ = [
    "LAST_USED_FILE",
    "STAGING_DIR_NAME",
    "CanonicalPathRefused",
    "Manifest",
    "ManifestFile",
    "ProgressCallback",
    "RemovalResult",
    "RetryPolicy",
    "StagedEntry",
    "StagingFailed",
    "StagingOptions",
    "StoreClient",
    "additional_bytes",
    "apply_recency",
    "disk_free_bytes",
    "is_complete",
    "is_safe_relative",
    "link_or_copy",
    "manifest_from_marker",
    "mark_used",
    "partial_bytes",
    "remove_staged",
    "remove_staged_dir",
    "scan_staged",
    "stage_from_local",
    "stage_from_remote",
    "staging_root_for",
]
