"""State snapshots next to the event log: the file format and its atomic writes.

A snapshot is the master's whole state as of one index (its *high-water* index), stored as
`snapshot.<idx>.msgpack.zst`: zstd over msgpack of `{"idx": <idx>, "state": <dict>}`. The
index is in the name (so a directory listing finds the newest without reading anything)
and again inside (so a renamed or swapped file is caught as corrupt). Snapshots let the
event log be compacted: events at or below a snapshot's index are no longer needed to
rebuild state.

This module only reads and writes files; deciding *when* to snapshot or compact, and what
to do when a write fails, belongs to `skulk.datadir.event_log.DiskEventLog`. It must never
leave a half-written file under a final name: every write goes to a temporary name
(`TMP_SUFFIX`), is fsynced, and is then renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

import msgpack
import zstandard

SNAPSHOTS_KEPT = 2
"""Snapshots kept on disk after a successful write: the newest plus one fallback, so a
snapshot that turns out corrupt (torn by a power cut, flipped bits) still leaves a usable
one behind."""

SNAPSHOT_MAX_BYTES = 1 << 30
"""Largest decompressed snapshot accepted, 1 GiB. A cluster's state is megabytes; the bound
keeps a corrupt frame header that claims a huge size from exhausting memory on read."""

SNAPSHOT_ZSTD_LEVEL = 3
"""zstd level for snapshots and archives: zstd's default, a good speed/ratio point for
msgpack (higher levels cost several times the CPU for a few percent)."""

TMP_SUFFIX = ".tmp"
"""Suffix of files being written. Anything with it is debris from a crash mid-write and is
deleted when the log directory is opened."""

_SNAPSHOT_NAME = re.compile(r"^snapshot\.(\d+)\.msgpack\.zst$")
_READ_CHUNK_BYTES = 1 << 20


class SnapshotCorruptError(Exception):
    """A snapshot file exists but cannot be used; carries the path and what was wrong."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"snapshot {path} is unusable: {detail}")
        self.path = path
        self.detail = detail


def snapshot_file_name(idx: int) -> str:
    return f"snapshot.{idx}.msgpack.zst"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """Snapshot files in `directory`, oldest index first. Temporaries are not listed."""
    found = []
    for entry in os.scandir(directory):
        match = _SNAPSHOT_NAME.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), Path(entry.path)))
    found.sort()
    return found


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable. Some filesystems refuse fsync on a directory
    (EINVAL): there the rename is as durable as that filesystem allows, so it is ignored."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that `path` is either absent/old or complete: temp name,
    fsync, rename, fsync the directory. The temp file is removed if anything fails."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def encode_snapshot(idx: int, state: dict) -> bytes:
    """The file bytes for a snapshot. Raises TypeError for state msgpack cannot encode and
    ValueError for state above SNAPSHOT_MAX_BYTES: both are caller bugs, found before any
    file is touched."""
    packed = msgpack.packb({"idx": idx, "state": state}, use_bin_type=True)
    if len(packed) > SNAPSHOT_MAX_BYTES:
        raise ValueError(f"snapshot state is {len(packed)} bytes packed, above {SNAPSHOT_MAX_BYTES}")
    return zstandard.ZstdCompressor(level=SNAPSHOT_ZSTD_LEVEL, write_checksum=True).compress(packed)


def write_snapshot_file(directory: Path, idx: int, state: dict) -> Path:
    """Atomically write the snapshot for `idx` (replacing one with the same index)."""
    path = directory / snapshot_file_name(idx)
    write_atomically(path, encode_snapshot(idx, state))
    return path


def read_snapshot_file(path: Path) -> tuple[int, dict]:
    """Read and check one snapshot. Raises SnapshotCorruptError when it cannot be used
    (including when it cannot be read at all)."""
    match = _SNAPSHOT_NAME.match(path.name)
    if match is None:
        raise SnapshotCorruptError(path, "not a snapshot file name")
    try:
        with open(path, "rb") as fh:
            reader = zstandard.ZstdDecompressor().stream_reader(fh)
            chunks = []
            total = 0
            while chunk := reader.read(_READ_CHUNK_BYTES):
                total += len(chunk)
                if total > SNAPSHOT_MAX_BYTES:
                    raise SnapshotCorruptError(path, f"decompresses beyond {SNAPSHOT_MAX_BYTES} bytes")
                chunks.append(chunk)
        body = msgpack.unpackb(b"".join(chunks), raw=False, strict_map_key=False)
    except SnapshotCorruptError:
        raise
    except (OSError, zstandard.ZstdError, ValueError, TypeError, msgpack.UnpackException) as exc:
        raise SnapshotCorruptError(path, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("state"), dict):
        raise SnapshotCorruptError(path, "payload is not {idx, state}")
    if body.get("idx") != int(match.group(1)):
        raise SnapshotCorruptError(path, f"holds idx {body.get('idx')!r}, name says {match.group(1)}")
    return body["idx"], body["state"]


def prune_snapshots(directory: Path, keep: int = SNAPSHOTS_KEPT) -> list[Path]:
    """Delete all but the `keep` newest snapshots; returns what was deleted. Raises OSError
    on the first deletion that fails (the caller decides how bad that is)."""
    deleted = []
    for _, path in list_snapshots(directory)[:-keep] if keep > 0 else list_snapshots(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        deleted.append(path)
    return deleted
