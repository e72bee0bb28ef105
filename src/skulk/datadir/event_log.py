"""The master's on-disk event log: append-only, rotated, compacted, and never fatal.

Every indexed event passes through here; followers replay from it on bootstrap. The log is
record-oriented and knows nothing of pydantic: a record is a msgpack-able dict with a
non-negative integer `"idx"` (the master's index). In production it is the camelCase wire
form of an IndexedEvent, `{"idx", "origin", "indexedAt", "event": {...}}`; every other key
is opaque here. Records round-trip through msgpack, so tuples come back as lists.

Files in the log directory:
- `events.bin`, the live file: uncompressed frames, each a 4-byte big-endian length then the
  msgpack payload. Only appended to, one `write` per record.
- `events.<firstIdx>-<lastIdx>.bin.zst`: archives. When the live file grows past
  `rotate_bytes`, and on `close()`, it is zstd-compressed to a temporary name, fsynced and
  renamed (a crash never leaves a half archive under a valid name), and a fresh live file
  starts. Archives are capped by count and by total bytes; the oldest go first.
- `events.high_water`: the last index, written at each rotation and on close, so a
  restarted master never reuses an index even after every archive was compacted away.
- `snapshot.<idx>.msgpack.zst`: state snapshots (format in `skulk.datadir.snapshots`).

What it must never do: crash the master or fill the disk. Any OSError while opening,
appending or rotating (ENOSPC above all), and free space on the log's filesystem below
`free_space_floor_bytes` (checked at open and every `free_space_check_every` appends), drop
the log into *counting-only* mode: `append` keeps validating and advancing `last_idx`, so
event ordering and follower coherence survive, but nothing more is written. The reason is
recorded in `stats()` and logged once. There is no automatic way back in this version: the
log persists again after the process restarts (a later version may probe and resume). The
one write counting-only mode still attempts is the few-byte high-water marker on `close()`,
best effort, so indices handed out while counting are not reused after a restart.

Housekeeping (archive caps, `compact_before`, snapshot writes and pruning) is gentler:
a failure that left the existing data intact (EACCES, EBUSY, ...) is recorded in
`stats()["compaction_error"]`, logged once, counted, and the log keeps persisting, because
nothing was lost and the free-space floor still guards the disk. A disk-trouble errno
(ENOSPC, EDQUOT, EROFS, EIO) during housekeeping says the filesystem itself is failing, so it
degrades to counting-only like any write failure.

Threading: every public method takes one lock, so appends may come from a worker thread
while another thread replays. Rotation compresses up to `rotate_bytes` inline (under a
second at the default), so async callers should call `append` via a thread, not on
the event loop. One process per directory: the node's data-dir lease guarantees that.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeGuard

import msgpack
import zstandard

from skulk.datadir.snapshots import (
    SNAPSHOT_ZSTD_LEVEL,
    SNAPSHOTS_KEPT,
    TMP_SUFFIX,
    SnapshotCorruptError,
    fsync_dir,
    list_snapshots,
    prune_snapshots,
    read_snapshot_file,
    write_atomically,
    write_snapshot_file,
)

logger = logging.getLogger(__name__)

DEFAULT_ROTATE_BYTES = 64 << 20
"""Live-file size past which the live file is rotated, 64 MiB: bounds the uncompressed tail
a reopen must scan and the work one rotation does inline (zstd level 3 ran at ~100 MB/s on
one core of the dev machine, so ~0.7 s)."""

MAX_ARCHIVES = 64
"""Archives kept at most; beyond it the oldest are deleted."""

MAX_ARCHIVE_TOTAL_BYTES = 1 << 30
"""Total compressed archive bytes kept at most, 1 GiB; beyond it the oldest are deleted,
so the log can never be the thing that fills a node's disk."""

FREE_SPACE_FLOOR_BYTES = 2 << 30
"""Free bytes on the log's filesystem below which the log stops writing (counting-only),
2 GiB: degrade while the rest of the node still has room to work, not at zero."""

FREE_SPACE_CHECK_EVERY = 1024
"""Appends between free-space checks: a statvfs per append would cost more than the append;
1024 small records cannot eat a meaningful part of the floor."""

MAX_RECORD_BYTES = (1 << 32) - 1
"""Largest msgpack payload one frame can hold: the length prefix is 4 bytes."""

LIVE_FILE_NAME = "events.bin"
HIGH_WATER_FILE_NAME = "events.high_water"
ARCHIVE_ZSTD_LEVEL = SNAPSHOT_ZSTD_LEVEL

_ARCHIVE_NAME = re.compile(r"^events\.(\d+)-(\d+)\.bin\.zst$")
_PREFIX_BYTES = 4
_READ_CHUNK_BYTES = 1 << 20
_MAX_READ_BYTES = 16 << 20  # one read call never asks for more, whatever a prefix claims
_DISK_TROUBLE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})

PERSISTING = "persisting"
COUNTING_ONLY = "counting_only"


class EventLogReadError(Exception):
    """Replay hit a file it cannot read to the end (corrupt archive, I/O error). The
    records yielded before it are good; the ones after are not available from this log."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"cannot replay {path}: {detail}")
        self.path = path
        self.detail = detail


class EventLogClosedError(RuntimeError):
    """The log was used after `close()`: a caller bug."""


class _DiskUsage(Protocol):
    @property
    def free(self) -> int: ...


# The I/O choke points below are module functions so tests can inject failures (ENOSPC at
# open, append, rotation, compaction) without a real broken disk.


def _open_live(path: Path) -> BinaryIO:
    # Unbuffered: each frame is one write syscall, so it is in the page cache (visible to
    # readers, surviving a process crash) as soon as append returns.
    return open(path, "ab", buffering=0)


def _write_all(fh: BinaryIO, data: bytes) -> None:
    written = fh.write(data)
    if written == len(data):
        return
    view = memoryview(data)[written or 0 :]
    while view:
        written = fh.write(view)
        if not written:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def _compress_file(src: Path, dst: Path, size_bytes: int) -> int:
    """Compress the first `size_bytes` of `src` into `dst` and fsync it; returns dst's size."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        zstandard.ZstdCompressor(level=ARCHIVE_ZSTD_LEVEL, write_checksum=True).copy_stream(fin, fout, size=size_bytes)
        fout.flush()
        os.fsync(fout.fileno())
        return fout.tell()


def _remove_file(path: Path) -> None:
    os.unlink(path)


def archive_file_name(first_idx: int, last_idx: int) -> str:
    return f"events.{first_idx}-{last_idx}.bin.zst"


def _is_idx(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _decode(payload: bytes | memoryview) -> dict:
    """One frame's record. Raises ValueError when it is not a record this log wrote."""
    try:
        record = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"payload does not decode: {exc}") from exc
    if not isinstance(record, dict) or not _is_idx(record.get("idx")):
        raise ValueError("payload is not a record with an integer idx")
    return record


class _FrameReader:
    """Splits a stream of length-prefixed frames, reading at most `limit` bytes. After
    iteration, `end_offset` is the offset just past the last complete frame and
    `leftover_bytes` how many bytes after it did not form one."""

    def __init__(self, read: Callable[[int], bytes], limit: int | None = None) -> None:
        self._read = read
        self._remaining = limit
        self.end_offset = 0
        self.leftover_bytes = 0

    def __iter__(self) -> Iterator[tuple[int, memoryview]]:
        buf = b""
        view = memoryview(buf)
        pos = 0
        base = 0
        while True:
            available = len(buf) - pos
            if available >= _PREFIX_BYTES:
                size = int.from_bytes(view[pos : pos + _PREFIX_BYTES], "big")
                end = pos + _PREFIX_BYTES + size
                if end <= len(buf):
                    yield base + pos, view[pos + _PREFIX_BYTES : end]
                    pos = end
                    self.end_offset = base + pos
                    continue
                want = end - len(buf)
            else:
                want = _PREFIX_BYTES - available
            want = min(max(want, _READ_CHUNK_BYTES), _MAX_READ_BYTES)
            if self._remaining is not None:
                want = min(want, self._remaining)
                if want == 0:
                    break
            chunk = self._read(want)
            if not chunk:
                break
            if self._remaining is not None:
                self._remaining -= len(chunk)
            buf = buf[pos:] + chunk
            view = memoryview(buf)
            base += pos
            pos = 0
        self.leftover_bytes = len(buf) - pos


@dataclass(frozen=True)
class _Archive:
    first_idx: int
    last_idx: int
    path: Path
    size_bytes: int


@dataclass
class _LiveScan:
    first_idx: int | None = None
    last_idx: int | None = None
    good_bytes: int = 0
    file_bytes: int = 0
    problem: str | None = None


def _scan_live(path: Path) -> _LiveScan:
    """Find the complete, decodable, idx-increasing prefix of the live file."""
    scan = _LiveScan()
    try:
        fh = open(path, "rb")  # noqa: SIM115 -- the scan owns the handle and closes it
    except FileNotFoundError:
        return scan
    with fh:
        scan.file_bytes = os.fstat(fh.fileno()).st_size
        reader = _FrameReader(fh.read, scan.file_bytes)
        for offset, payload in reader:
            try:
                idx = _decode(payload)["idx"]
            except ValueError as exc:
                scan.problem = f"record at byte {offset}: {exc}"
                break
            if scan.last_idx is not None and idx <= scan.last_idx:
                scan.problem = f"record at byte {offset}: idx {idx} after {scan.last_idx}"
                break
            if scan.first_idx is None:
                scan.first_idx = idx
            scan.last_idx = idx
            scan.good_bytes = offset + _PREFIX_BYTES + len(payload)
        else:
            if reader.leftover_bytes:
                scan.problem = f"incomplete record at byte {reader.end_offset}"
    return scan


def _list_archives(directory: Path) -> list[_Archive]:
    archives = []
    for entry in os.scandir(directory):
        match = _ARCHIVE_NAME.match(entry.name)
        if match and entry.is_file():
            first, last = int(match.group(1)), int(match.group(2))
            archives.append(_Archive(first, last, Path(entry.path), entry.stat().st_size))
    archives.sort(key=lambda a: (a.first_idx, a.last_idx))
    return archives


@dataclass(frozen=True)
class _Source:
    """One file of a replay, opened when the replay starts."""

    path: Path
    fh: BinaryIO
    reader: _FrameReader
    expected_last_idx: int | None  # from an archive's name; None for the live file

    def records(self) -> Iterator[dict]:
        last = None
        try:
            for offset, payload in self.reader:
                try:
                    record = _decode(payload)
                except ValueError as exc:
                    raise EventLogReadError(self.path, f"record at byte {offset}: {exc}") from exc
                last = record["idx"]
                yield record
        except (OSError, zstandard.ZstdError) as exc:
            raise EventLogReadError(self.path, f"{type(exc).__name__}: {exc}") from exc
        if self.reader.leftover_bytes:
            raise EventLogReadError(self.path, f"ends inside a record at byte {self.reader.end_offset}")
        # zstd reports no error for a truncated frame: the name's last idx catches it.
        if self.expected_last_idx is not None and last != self.expected_last_idx:
            raise EventLogReadError(self.path, f"ends at idx {last}, its name says {self.expected_last_idx}")


class DiskEventLog:
    """Append-only, rotated event log that degrades to counting-only instead of failing.

    `fsync=False` (the default) flushes each record to the OS but does not fsync it: a
    process crash loses nothing, a power cut may lose the last moments of events (the torn
    tail is cut on reopen). An fsync per event would cap the master at the disk's flush
    latency, hundreds to a few thousand events/s, and the cluster's followers hold the same
    events in memory. Rotation, snapshots and the high-water marker are always fsynced:
    they are rare, and losing them would lose more than a tail.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        max_archives: int = MAX_ARCHIVES,
        max_archive_total_bytes: int = MAX_ARCHIVE_TOTAL_BYTES,
        free_space_floor_bytes: int = FREE_SPACE_FLOOR_BYTES,
        free_space_check_every: int = FREE_SPACE_CHECK_EVERY,
        fsync: bool = False,
        clock: Callable[[], float] = time.time,
        disk_usage: Callable[[str], _DiskUsage] = shutil.disk_usage,
    ) -> None:
        if rotate_bytes <= 0 or free_space_check_every <= 0:
            raise ValueError("rotate_bytes and free_space_check_every must be positive")
        if max_archives < 0 or max_archive_total_bytes < 0 or free_space_floor_bytes < 0:
            raise ValueError("archive caps and the free-space floor must not be negative")
        self.directory = Path(directory)
        self._live_path = self.directory / LIVE_FILE_NAME
        self._rotate_bytes = rotate_bytes
        self._max_archives = max_archives
        self._max_archive_total_bytes = max_archive_total_bytes
        self._floor_bytes = free_space_floor_bytes
        self._check_every = free_space_check_every
        self._fsync = fsync
        self._clock = clock
        self._disk_usage = disk_usage
        self._lock = threading.RLock()
        self._packer = msgpack.Packer(use_bin_type=True)

        self._mode = PERSISTING
        self._degraded_reason: str | None = None
        self._degraded_at: float | None = None
        self._closed = False
        self._last_idx: int | None = None
        self._marker_idx: int | None = None
        self._live_fh: BinaryIO | None = None
        self._live_first: int | None = None
        self._live_bytes = 0
        self._archives: list[_Archive] = []
        self._archive_bytes = 0
        self._appends_since_check = 0
        self._records_written = 0
        self._records_counted_only = 0
        self._truncated_tail_bytes = 0
        self._archives_deleted = 0
        self._compaction_error: str | None = None
        self._compaction_errors = 0
        self._corrupt_snapshots: set[Path] = set()
        self._open()

    # ---- open -------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_debris()
            self._archives = _list_archives(self.directory)
            self._archive_bytes = sum(a.size_bytes for a in self._archives)
            if self._archives:
                self._bump_last_idx(max(a.last_idx for a in self._archives))
            self._marker_idx = self._read_marker()
            self._bump_last_idx(self._marker_idx)
            snapshots = list_snapshots(self.directory)
            if snapshots:
                self._bump_last_idx(snapshots[-1][0])
            self._recover_live()
            self._enforce_caps()
            self._check_free_space()
            if self._mode == PERSISTING:
                self._live_fh = _open_live(self._live_path)
        except OSError as exc:
            self._degrade("open", exc)

    def _remove_debris(self) -> None:
        for entry in os.scandir(self.directory):
            if entry.name.endswith(TMP_SUFFIX):
                logger.info("event log %s: removing %s left by an interrupted write", self.directory, entry.name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _read_marker(self) -> int | None:
        try:
            text = (self.directory / HIGH_WATER_FILE_NAME).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            text = ""
        if text.isdigit():
            return int(text)
        logger.warning("event log %s: ignoring unreadable %s", self.directory, HIGH_WATER_FILE_NAME)
        return None

    def _recover_live(self) -> None:
        scan = _scan_live(self._live_path)
        cut = scan.file_bytes - scan.good_bytes
        if cut:
            with open(self._live_path, "r+b") as fh:
                fh.truncate(scan.good_bytes)
            self._truncated_tail_bytes = cut
            logger.warning(
                "event log %s: cut %d bytes of torn tail from %s (%s); kept records up to idx %s",
                self.directory, cut, LIVE_FILE_NAME, scan.problem, scan.last_idx,
            )
        archived_last = self._archives[-1].last_idx if self._archives else None
        if scan.last_idx is not None and archived_last is not None and scan.last_idx <= archived_last:
            # A crash after an archive was renamed into place but before the live file was
            # replaced: every live record is already archived.
            logger.warning(
                "event log %s: %s (idx %s-%s) is already archived; starting a fresh one",
                self.directory, LIVE_FILE_NAME, scan.first_idx, scan.last_idx,
            )
            _remove_file(self._live_path)
            return
        self._live_first = scan.first_idx
        self._live_bytes = scan.good_bytes
        self._bump_last_idx(scan.last_idx)

    # ---- append -----------------------------------------------------------------------

    def append(self, record: Mapping[str, Any]) -> None:
        """Persist one record (or only count it, in counting-only mode).

        Raises ValueError when `record["idx"]` is missing, not a non-negative int, or not
        above `last_idx`, or when the record is too large for a frame; TypeError when
        msgpack cannot encode it. These are caller bugs and raise in either mode. Disk
        failures never raise: they switch the log to counting-only.
        """
        idx = record.get("idx") if isinstance(record, Mapping) else None
        if not _is_idx(idx):
            raise ValueError(f"record needs a non-negative integer 'idx', got {idx!r}")
        with self._lock:
            if self._closed:
                raise EventLogClosedError(f"event log {self.directory} is closed")
            if self._last_idx is not None and idx <= self._last_idx:
                raise ValueError(f"idx {idx} is not above the last idx {self._last_idx}")
            payload = self._packer.pack(record)
            if len(payload) > MAX_RECORD_BYTES:
                raise ValueError(f"record {idx} is {len(payload)} bytes packed, above {MAX_RECORD_BYTES}")
            if self._mode == PERSISTING:
                self._appends_since_check += 1
                if self._appends_since_check >= self._check_every:
                    self._appends_since_check = 0
                    self._check_free_space()
            if self._mode == PERSISTING:
                self._write_frame(len(payload).to_bytes(_PREFIX_BYTES, "big") + payload, idx)
            if self._mode == PERSISTING:
                self._records_written += 1
            else:
                self._records_counted_only += 1
            self._last_idx = idx
            if self._mode == PERSISTING and self._live_bytes > self._rotate_bytes:
                self._rotate()

    def _write_frame(self, frame: bytes, idx: int) -> None:
        try:
            assert self._live_fh is not None
            _write_all(self._live_fh, frame)
            if self._fsync:
                os.fsync(self._live_fh.fileno())
        except OSError as exc:
            self._degrade("append", exc)
            # A short write may have left part of this frame; cut it so the file holds only
            # whole records (reopen would cut it anyway).
            with contextlib.suppress(OSError):
                os.truncate(self._live_path, self._live_bytes)
            self._close_live()
            return
        if self._live_first is None:
            self._live_first = idx
        self._live_bytes += len(frame)

    # ---- rotation and caps ------------------------------------------------------------

    def _rotate(self) -> None:
        if self._mode != PERSISTING or self._live_bytes == 0:
            return
        assert self._live_first is not None and self._last_idx is not None
        first, last = self._live_first, self._last_idx
        final = self.directory / archive_file_name(first, last)
        tmp = final.with_name(final.name + TMP_SUFFIX)
        try:
            size = _compress_file(self._live_path, tmp, self._live_bytes)
            os.replace(tmp, final)
            fsync_dir(self.directory)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self._degrade("rotation", exc)
            return
        self._archives.append(_Archive(first, last, final, size))
        self._archive_bytes += size
        try:
            self._close_live()
            # Unlink, never truncate: a replay in progress holds the old inode open and
            # keeps reading it.
            _remove_file(self._live_path)
            self._live_bytes = 0
            self._live_first = None
            self._live_fh = _open_live(self._live_path)
            self._write_marker(last)
        except OSError as exc:
            self._degrade("rotation", exc)
        self._enforce_caps()

    def _enforce_caps(self) -> None:
        victims = []
        count, total = len(self._archives), self._archive_bytes
        for archive in self._archives:
            if count <= self._max_archives and total <= self._max_archive_total_bytes:
                break
            victims.append(archive)
            count -= 1
            total -= archive.size_bytes
        if victims:
            deleted = self._delete_archives(victims, "archive cap")
            if deleted:
                logger.info(
                    "event log %s: archive cap (%d files, %d bytes) deleted %d oldest archives; "
                    "replay now starts at idx %s",
                    self.directory, self._max_archives, self._max_archive_total_bytes, deleted, self.first_idx,
                )

    def _delete_archives(self, victims: list[_Archive], stage: str) -> int:
        deleted = 0
        for archive in victims:
            try:
                _remove_file(archive.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._housekeeping_failed(stage, exc)
                break
            self._archives.remove(archive)
            self._archive_bytes -= archive.size_bytes
            self._archives_deleted += 1
            deleted += 1
        return deleted

    def _housekeeping_failed(self, stage: str, exc: OSError) -> None:
        if exc.errno in _DISK_TROUBLE_ERRNOS:
            self._degrade(stage, exc)
            return
        self._compaction_errors += 1
        self._compaction_error = f"{stage}: {exc}"
        if self._compaction_errors == 1:
            logger.warning(
                "event log %s: %s failed (%s); existing data is intact, still persisting; "
                "further such failures are only counted in stats()",
                self.directory, stage, exc,
            )

    # ---- snapshots and compaction -----------------------------------------------------

    def write_snapshot(self, high_water_idx: int, state: dict[str, Any]) -> bool:
        """Atomically write `state` as of `high_water_idx` and keep the newest
        SNAPSHOTS_KEPT snapshots. Returns False, writing nothing, in counting-only mode or
        when the write fails: a disk-trouble errno degrades the log, any other error is
        recorded like a compaction failure (stats()["compaction_error"]).
        Raises ValueError when `high_water_idx` is above `last_idx` (a snapshot of events
        this log never saw) and TypeError for state msgpack cannot encode."""
        if not _is_idx(high_water_idx):
            raise ValueError(f"high_water_idx must be a non-negative int, got {high_water_idx!r}")
        with self._lock:
            if self._closed:
                raise EventLogClosedError(f"event log {self.directory} is closed")
            if self._last_idx is None or high_water_idx > self._last_idx:
                raise ValueError(f"snapshot idx {high_water_idx} is above the last idx {self._last_idx}")
            if self._mode != PERSISTING:
                return False
            try:
                write_snapshot_file(self.directory, high_water_idx, state)
            except OSError as exc:
                if exc.errno in _DISK_TROUBLE_ERRNOS:
                    self._degrade("snapshot", exc)
                else:
                    self._housekeeping_failed("snapshot", exc)
                return False
            try:
                prune_snapshots(self.directory, SNAPSHOTS_KEPT)
            except OSError as exc:
                self._housekeeping_failed("snapshot pruning", exc)
            return True

    def latest_snapshot(self) -> tuple[int, dict] | None:
        """The newest readable snapshot as (high_water_idx, state), or None. A corrupt one
        is logged (once per file) and skipped in favour of the one before."""
        with self._lock:
            try:
                snapshots = list_snapshots(self.directory)
            except OSError as exc:
                logger.warning("event log %s: cannot list snapshots: %s", self.directory, exc)
                return None
            for _, path in reversed(snapshots):
                try:
                    return read_snapshot_file(path)
                except SnapshotCorruptError as exc:
                    if path not in self._corrupt_snapshots:
                        self._corrupt_snapshots.add(path)
                        logger.warning("event log %s: %s; falling back to an older snapshot", self.directory, exc)
            return None

    def compact_before(self, idx: int) -> int:
        """Delete archives whose last idx is below `idx`; returns how many were deleted.
        Never touches the live file or any archive holding an index at or after `idx`.
        Works in counting-only mode too (it only deletes). A failure is recorded, see the
        module docstring; it never raises."""
        if not _is_idx(idx):
            raise ValueError(f"idx must be a non-negative int, got {idx!r}")
        with self._lock:
            victims = [a for a in self._archives if a.last_idx < idx]
            deleted = self._delete_archives(victims, "compaction")
            if deleted:
                logger.info(
                    "event log %s: compacted %d archives before idx %d", self.directory, deleted, idx
                )
            return deleted

    # ---- replay -----------------------------------------------------------------------

    def read_range(self, start_idx: int, end_idx: int | None = None) -> Iterator[dict]:
        """Yield the persisted records with start_idx <= idx (< end_idx), in idx order.

        The set of files is fixed when iteration starts (their handles are opened then), so
        appends, rotation, caps and compaction may go on meanwhile: the replay sees exactly
        what was persisted at that moment. Records appended later are not included; ask
        again from the last idx seen plus one. The first record may be above start_idx when
        older archives were capped or compacted away (see `first_idx`), and records counted
        while in counting-only mode were never written. Raises EventLogReadError when a
        file in range cannot be read to the end.
        """
        if not _is_idx(start_idx) or not (end_idx is None or type(end_idx) is int):
            raise ValueError("start_idx must be a non-negative int and end_idx an int or None")
        return self._replay(start_idx, end_idx)

    def _replay(self, start_idx: int, end_idx: int | None) -> Iterator[dict]:
        sources = self._open_sources(start_idx, end_idx)
        try:
            last = -1
            for source in sources:
                for record in source.records():
                    idx = record["idx"]
                    if idx <= last or idx < start_idx:
                        continue  # before the range, or a duplicate of an interrupted rotation
                    if end_idx is not None and idx >= end_idx:
                        return
                    last = idx
                    yield record
        finally:
            for source in sources:
                source.fh.close()

    def _open_sources(self, start_idx: int, end_idx: int | None) -> list[_Source]:
        sources: list[_Source] = []
        with self._lock:
            try:
                for archive in self._archives:
                    if archive.last_idx < start_idx or (end_idx is not None and archive.first_idx >= end_idx):
                        continue
                    fh = open(archive.path, "rb")  # noqa: SIM115 -- owned by the _Source, closed with the reader
                    read = zstandard.ZstdDecompressor().stream_reader(fh).read
                    sources.append(_Source(archive.path, fh, _FrameReader(read), archive.last_idx))
                if self._live_bytes and (end_idx is None or self._live_first is None or self._live_first < end_idx):
                    fh = open(self._live_path, "rb")  # noqa: SIM115 -- owned by the _Source, closed with the reader
                    sources.append(_Source(self._live_path, fh, _FrameReader(fh.read, self._live_bytes), None))
            except OSError as exc:
                for source in sources:
                    source.fh.close()
                raise EventLogReadError(Path(exc.filename or self.directory), str(exc)) from exc
        return sources

    # ---- state ------------------------------------------------------------------------

    @property
    def last_idx(self) -> int | None:
        """The highest idx appended (persisted or counted) or recovered on open; None for a
        log that never held a record. The next append must be above it."""
        return self._last_idx

    @property
    def first_idx(self) -> int | None:
        """The lowest idx replay can still return, or None when nothing is on disk."""
        with self._lock:
            if self._archives:
                return self._archives[0].first_idx
            return self._live_first

    @property
    def mode(self) -> str:
        return self._mode

    def stats(self) -> dict[str, Any]:
        """Diagnostics for /v1/diagnostics/node."""
        with self._lock:
            return {
                "directory": str(self.directory),
                "mode": self._mode,
                "degraded_reason": self._degraded_reason,
                "degraded_at": self._degraded_at,
                "last_idx": self._last_idx,
                "first_idx": self._archives[0].first_idx if self._archives else self._live_first,
                "records_written": self._records_written,
                "records_counted_only": self._records_counted_only,
                "live_bytes": self._live_bytes,
                "archive_count": len(self._archives),
                "archive_bytes": self._archive_bytes,
                "archives_deleted": self._archives_deleted,
                "truncated_tail_bytes": self._truncated_tail_bytes,
                "compaction_error": self._compaction_error,
                "compaction_errors": self._compaction_errors,
                "rotate_bytes": self._rotate_bytes,
                "max_archives": self._max_archives,
                "max_archive_total_bytes": self._max_archive_total_bytes,
                "free_space_floor_bytes": self._floor_bytes,
            }

    # ---- degradation ------------------------------------------------------------------

    def _check_free_space(self) -> None:
        if self._mode != PERSISTING or self._floor_bytes == 0:
            return
        try:
            free = self._disk_usage(str(self.directory)).free
        except OSError as exc:
            self._degrade("free-space check", exc)
            return
        if free < self._floor_bytes:
            self._degrade("free-space floor", f"{free} bytes free, below the floor of {self._floor_bytes}")

    def _degrade(self, stage: str, cause: OSError | str) -> None:
        if self._mode == COUNTING_ONLY:
            return
        self._mode = COUNTING_ONLY
        self._degraded_reason = f"{stage}: {cause}"
        self._degraded_at = self._clock()
        self._close_live()
        logger.error(
            "event log %s stopped persisting (%s); counting indices only from idx %s on, "
            "nothing more is written until the process restarts",
            self.directory, self._degraded_reason, self._last_idx,
        )

    def _close_live(self) -> None:
        if self._live_fh is not None:
            fh, self._live_fh = self._live_fh, None
            with contextlib.suppress(OSError):
                fh.close()

    def _bump_last_idx(self, idx: int | None) -> None:
        if idx is not None and (self._last_idx is None or idx > self._last_idx):
            self._last_idx = idx

    def _write_marker(self, idx: int) -> None:
        write_atomically(self.directory / HIGH_WATER_FILE_NAME, f"{idx}\n".encode("ascii"))
        self._marker_idx = idx

    # ---- close ------------------------------------------------------------------------

    def close(self) -> None:
        """Archive the live file (when persisting) and record the high-water index. Never
        raises for disk trouble; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._rotate()
            self._close_live()
            if self._last_idx is not None and self._last_idx != self._marker_idx:
                try:
                    self._write_marker(self._last_idx)
                except OSError as exc:
                    logger.warning(
                        "event log %s: could not record high-water idx %s on close: %s",
                        self.directory, self._last_idx, exc,
                    )
            self._closed = True

    def __enter__(self) -> DiskEventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
