"""An exclusive flock with a deadline: the one mechanism behind every store path that
serialises on a file (tiny-model generation, hub downloads and their volume admission, store
staging's admission).

Each call opens its own descriptor, so threads of one process exclude each other as well as
processes do. The lock file is never deleted (a late opener would lock an orphaned inode).
The wait is polled, so it ends at its deadline or, when given, as soon as `cancel` is set;
either way the caller's own typed error is raised, built by `fail(kind, message)` with kind
"deadline" or "cancelled".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

LockFailure = Literal["deadline", "cancelled"]


@contextlib.contextmanager
def exclusive_file_lock(
    lock_path: Path,
    timeout_s: float,
    fail: Callable[[LockFailure, str], Exception],
    *,
    poll_s: float = 0.2,
    cancel: threading.Event | None = None,
) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` for the body; raise `fail(...)` instead when it
    cannot be had within `timeout_s` (or `cancel` is set while waiting)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None and cancel.is_set():
                    raise fail("cancelled", f"cancelled while waiting for {lock_path}") from None
                if time.monotonic() >= deadline:
                    raise fail("deadline", f"another process held {lock_path} for over {timeout_s:.0f} s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)  # releases the lock


__all__ = ["LockFailure", "exclusive_file_lock"]
