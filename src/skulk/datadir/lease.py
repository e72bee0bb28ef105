"""Cooperative leases: one owner per data dir, one model-holding daemon per accelerator.

A lease is a small JSON record (holder pid, host, node id, API endpoint, expiry) in a file.
The holder renews it on a timer; a second process that finds a live, unexpired holder
refuses to start and names it. A holder whose process is gone, or whose lease expired, is
taken over. Acquisition is serialised with a short `flock` on a side file, so two processes
racing for a free lease cannot both win. A holder that fails to renew (the file became
unwritable, or someone else now holds it) self-fences: its `on_fenced` callback stops the
node from serving, because another owner may already be acting on the same data.

The decision "may I take this lease?" is the pure `lease_decision`; this module's classes
only read and write files around it. The device lease uses the same record at a fixed,
data-dir-independent location (`device_lease_dir`) so two daemons with different data dirs
still never make models resident on the same GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from skulk.shared.settings import setting
from skulk.shared.ticks import until_tick_s

logger = logging.getLogger(__name__)

LEASE_TTL_S = 15.0
"""How long a lease stays valid without renewal. Long enough to ride out a stalled event
loop (GC pause, heavy import), short enough that a crashed holder frees the data dir fast."""

LEASE_RENEW_INTERVAL_S = 5.0
"""Renewal period: three chances to renew before expiry."""

DEVICE_LEASE_DIR_ENV = "SKULK_DEVICE_LEASE_DIR"
DEFAULT_DEVICE_LEASE_DIR = Path(tempfile.gettempdir()) / "skulk-device-leases"


@dataclass(frozen=True)
class LeaseRecord:
    pid: int
    host: str
    node_id: str
    api_endpoint: str | None
    acquired_at: float
    expires_at: float

    def describe(self) -> str:
        endpoint = self.api_endpoint or "no API"
        return f"pid {self.pid} on {self.host}, node {self.node_id}, {endpoint}"


@dataclass(frozen=True)
class Take:
    """The lease is free (absent, expired, or its holder process is gone)."""

    reason: str


@dataclass(frozen=True)
class Held:
    holder: LeaseRecord


def lease_decision(
    existing: LeaseRecord | None,
    *,
    now: float,
    my_host: str,
    pid_alive: Callable[[int], bool],
) -> Take | Held:
    if existing is None:
        return Take("no lease")
    if existing.expires_at <= now:
        return Take(f"lease of {existing.describe()} expired")
    if existing.host == my_host and not pid_alive(existing.pid):
        return Take(f"holder {existing.describe()} is no longer running")
    return Held(existing)


class LeaseHeldError(RuntimeError):
    def __init__(self, path: Path, holder: LeaseRecord) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"{path} is held by another Skulk process: {holder.describe()}")


class LeaseLostError(RuntimeError):
    """Our lease was taken over or removed while we believed we held it."""

    def __init__(self, path: Path, holder: LeaseRecord | None) -> None:
        self.path = path
        self.holder = holder
        now_held_by = holder.describe() if holder else "nobody"
        super().__init__(f"lease {path} is no longer ours (now held by {now_held_by})")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_lease(path: Path) -> LeaseRecord | None:
    """The current record, or None if absent or unreadable (a torn record counts as free:
    writes happen under the acquisition lock, so only a holder that died mid-write, or
    outside tampering, leaves one)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return LeaseRecord(**raw)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        logger.warning("lease file %s is unreadable (%s); treating it as free", path, exc)
        return None


LEASE_RECORD_BYTES = 1024
"""Every lease file is exactly this long: the JSON record padded with spaces (JSON ignores
trailing whitespace). Renewal rewrites it in place, inside blocks the file already owns, so
a full disk never stops a lease from renewing (a new temporary file would need a free
block, and ENOSPC used to self-fence a node that was serving fine)."""


def _encode(record: LeaseRecord) -> bytes:
    text = json.dumps(asdict(record)).encode("utf-8")
    if len(text) >= LEASE_RECORD_BYTES:
        raise ValueError(f"lease record of {len(text)} bytes exceeds {LEASE_RECORD_BYTES}")
    return text + b" " * (LEASE_RECORD_BYTES - 1 - len(text)) + b"\n"


def _write_lease(path: Path, record: LeaseRecord) -> None:
    """Rewrite the record in place when the file already has its full size (no new block
    is needed: renewals work on a full disk); otherwise create it whole, by rename, so a
    reader never sees a short file. Callers hold the acquisition lock, so no reader sees a
    record half rewritten."""
    data = _encode(record)
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        fd = None
    if fd is not None:
        try:
            if os.fstat(fd).st_size == LEASE_RECORD_BYTES:
                os.pwrite(fd, data, 0)
                os.fsync(fd)
                return
        finally:
            os.close(fd)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _acquisition_lock(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Lease:
    """One held lease file. `acquire()` or raise `LeaseHeldError`; `run_renewal()` keeps it."""

    def __init__(
        self,
        path: Path,
        *,
        node_id: str,
        api_endpoint: str | None = None,
        ttl_s: float = LEASE_TTL_S,
        renew_interval_s: float = LEASE_RENEW_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self.api_endpoint = api_endpoint
        self.ttl_s = ttl_s
        self.renew_interval_s = renew_interval_s
        self._clock = clock
        self._host = socket.gethostname()
        self._record: LeaseRecord | None = None
        self.fenced_reason: str | None = None

    @property
    def held(self) -> bool:
        return self._record is not None and self.fenced_reason is None

    def _mine(self, now: float, acquired_at: float) -> LeaseRecord:
        return LeaseRecord(
            pid=os.getpid(),
            host=self._host,
            node_id=self.node_id,
            api_endpoint=self.api_endpoint,
            acquired_at=acquired_at,
            expires_at=now + self.ttl_s,
        )

    def acquire(self) -> LeaseRecord:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _acquisition_lock(self.path):
            now = self._clock()
            decision = lease_decision(read_lease(self.path), now=now, my_host=self._host, pid_alive=pid_alive)
            if isinstance(decision, Held):
                raise LeaseHeldError(self.path, decision.holder)
            record = self._mine(now, acquired_at=now)
            _write_lease(self.path, record)
        if decision.reason != "no lease":
            logger.info("took over lease %s: %s", self.path, decision.reason)
        self._record = record
        return record

    def renew(self) -> None:
        """Extend the lease; raise if it is no longer ours or cannot be written."""
        if self._record is None:
            raise RuntimeError("renew() before acquire()")
        with _acquisition_lock(self.path):
            current = read_lease(self.path)
            if current is None or current.pid != os.getpid() or current.host != self._host:
                raise LeaseLostError(self.path, current)
            record = self._mine(self._clock(), acquired_at=self._record.acquired_at)
            _write_lease(self.path, record)
        self._record = record

    async def run_renewal(self, on_fenced: Callable[[str], None]) -> None:
        """Renew until cancelled; on the first failure, fence and return."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(until_tick_s(loop.time(), self.renew_interval_s))  # on the tick grid (`shared.ticks`)
            try:
                await asyncio.to_thread(self.renew)
            except (OSError, RuntimeError) as exc:
                self.fenced_reason = f"lease renewal failed: {exc}"
                logger.error("%s; this node stops serving (self-fenced)", self.fenced_reason)
                on_fenced(self.fenced_reason)
                return

    def release(self) -> None:
        """Expire the lease if it is still ours. Never raises: release runs during shutdown."""
        if self._record is None:
            return
        try:
            with _acquisition_lock(self.path):
                current = read_lease(self.path)
                if current is not None and current.pid == os.getpid() and current.host == self._host:
                    # Expired in place rather than deleted: the file keeps its blocks, so the
                    # next start can take it on a full disk.
                    _write_lease(self.path, dataclasses.replace(current, expires_at=0.0))
        except OSError as exc:
            logger.warning("could not release lease %s: %s", self.path, exc)
        self._record = None


def device_lease_dir(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    override = setting(DEVICE_LEASE_DIR_ENV, env)
    return Path(override) if override else DEFAULT_DEVICE_LEASE_DIR


def device_lease(device_id: str, *, node_id: str, api_endpoint: str | None = None) -> Lease:
    """The lease guarding one accelerator, e.g. `cuda:0`, `metal:0`, `rocm:1`.

    CPU work needs no device lease: RAM is admitted by the capacity planner instead."""
    safe = device_id.replace(":", "-").replace("/", "-")
    return Lease(device_lease_dir() / f"{safe}.lease", node_id=node_id, api_endpoint=api_endpoint)
