"""Replace a small file so that a reader (or a crash) sees the old content or the new, never
a torn mix: write a temporary file beside it, fsync it, rename it over the target.

Written once here; markers, cards, intent records and the remembered store all need it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, *, newline: str | None = None) -> None:
    """Atomically replace `path` with `text` (UTF-8). The temporary file is removed when
    anything fails; the target's directory must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["write_atomic"]
