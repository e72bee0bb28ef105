"""Whether a download may start on its volume: the operating-system disk reserve, decided
before a single byte is written.

The store host's canonical copy and the store-unreachable direct fallback write into the
node's models dir, which no eviction pass may touch (it is the cluster's source of truth,
or the only copy a node has). So instead of evicting, a hub download asks here first: the
bytes it still has to fetch (the exact selected manifest, minus what is already on disk or
resumable) must fit in the volume's free space with the reserve left over. Otherwise it
fails with the arithmetic in its reason, and nothing lands on a disk it would have filled.

`admit` is the pure decision (table-driven tests); `disk_free_bytes` and the env reader are
the only I/O here, kept beside it so that staging and downloads measure a volume the same
way. The shell (`downloads.download_model`) holds a per-volume lock across admission and
transfer, so two downloads cannot both spend the same free bytes.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skulk.datadir.config import DISK_RESERVE_ENV
from skulk.shared.health import DEFAULT_RESERVE_BYTES, GIB
from skulk.shared.settings import setting


@dataclass(frozen=True)
class DiskVerdict:
    """The admission arithmetic, kept whole so a refusal can explain itself."""

    needed_bytes: int
    """Bytes the transfer still has to write (resumable and finished data credited)."""
    free_bytes: int
    reserve_bytes: int

    @property
    def fits(self) -> bool:
        return self.needed_bytes + self.reserve_bytes <= self.free_bytes

    @property
    def shortfall_bytes(self) -> int:
        return max(0, self.needed_bytes + self.reserve_bytes - self.free_bytes)

    def reason(self, volume: Path | str) -> str:
        return (
            f"not enough disk on {volume}: {_size(self.needed_bytes)} still to fetch + {_size(self.reserve_bytes)} "
            f"reserve kept free for the operating system = {_size(self.needed_bytes + self.reserve_bytes)} needed, "
            f"only {_size(self.free_bytes)} free (short by {_size(self.shortfall_bytes)}); free space on that volume "
            f"or lower model_store.disk_reserve_gb / {DISK_RESERVE_ENV}"
        )


def bytes_to_fetch(sizes: Mapping[str, int], present: Mapping[str, int]) -> int:
    """Bytes of the selected files (`sizes`) not yet on disk; `present` is what each file
    already has (finished, or a resumable partial), capped at its size."""
    return sum(max(0, size - min(max(present.get(path, 0), 0), size)) for path, size in sizes.items())


def admit(sizes: Mapping[str, int], present: Mapping[str, int], free_bytes: int, reserve_bytes: int) -> DiskVerdict:
    """The verdict for fetching `sizes` onto a volume with `free_bytes` free. Pure."""
    return DiskVerdict(bytes_to_fetch(sizes, present), max(0, free_bytes), max(0, reserve_bytes))


def reserve_bytes_from_env(env: Mapping[str, str], default: int = DEFAULT_RESERVE_BYTES) -> int:
    """The reserve SKULK_DISK_RESERVE_GB asks for, else `default`: for callers without a
    node config (`skulk models pull`, a bare `download_model`). A malformed value is an
    error naming the variable, never a silently different reserve."""
    raw = setting(DISK_RESERVE_ENV, env)
    if not raw:
        return default
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"{DISK_RESERVE_ENV}={raw!r} is not a number of GiB") from None
    if gib < 0 or gib != gib:  # negative or NaN
        raise ValueError(f"{DISK_RESERVE_ENV}={raw!r} must be >= 0")
    return int(gib * GIB)


def disk_free_bytes(path: Path) -> int:
    """Free bytes of the volume holding `path` (its nearest existing ancestor)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _size(n: int) -> str:
    return f"{n} bytes ({n / GIB:.2f} GiB)"


__all__ = [
    "DISK_RESERVE_ENV",
    "DiskVerdict",
    "admit",
    "bytes_to_fetch",
    "disk_free_bytes",
    "reserve_bytes_from_env",
]
