"""A real full disk for tests: a small tmpfs mounted under the test's temp dir, filled until
ENOSPC. Needs root (CI runs as root); `full_disk_or_skip` skips where mounting is refused.
The mount is always unmounted, pass or fail."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` at `path` (skips the test when it cannot be mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full-disk test: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(disk: Path, name: str = "filler") -> int:
    """Write zeros into `disk/name` until the disk is full; returns the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with open(disk / name, "wb", buffering=0) as handle:
        while True:
            try:
                written += handle.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    for size in (4096, 512, 1):  # the last partial blocks too
        with contextlib.suppress(OSError), open(disk / f"{name}-{size}", "ab", buffering=0) as handle:
            while handle.write(b"\0" * size):
                written += size
    return written
