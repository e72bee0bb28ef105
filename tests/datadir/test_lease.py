import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from skulk.datadir.lease import (
    Held,
    Lease,
    LeaseHeldError,
    LeaseRecord,
    Take,
    device_lease,
    lease_decision,
    read_lease,
)

HOST = socket.gethostname()


def record(pid=111, host=HOST, expires_at=100.0):
    return LeaseRecord(pid=pid, host=host, node_id="n1", api_endpoint="http://127.0.0.1:1", acquired_at=0.0,
                       expires_at=expires_at)


@pytest.mark.parametrize(
    ("existing", "now", "alive", "expected"),
    [
        (None, 50.0, True, Take),
        (record(expires_at=100.0), 50.0, True, Held),
        (record(expires_at=100.0), 100.0, True, Take),  # expired at the boundary
        (record(expires_at=100.0), 50.0, False, Take),  # holder process gone
        (record(host="elsewhere", expires_at=100.0), 50.0, False, Held),  # cannot see a remote pid: trust expiry
        (record(host="elsewhere", expires_at=100.0), 150.0, False, Take),
    ],
)
def test_lease_decision(existing, now, alive, expected):
    decision = lease_decision(existing, now=now, my_host=HOST, pid_alive=lambda _pid: alive)
    assert isinstance(decision, expected)


def test_second_holder_is_refused_and_named(tmp_path):
    path = tmp_path / "skulk.lease"
    first = Lease(path, node_id="first", api_endpoint="http://127.0.0.1:5000")
    first.acquire()
    # A different process (a real one) must be refused while we live.
    code = (
        "import sys; from pathlib import Path; from skulk.datadir.lease import Lease, LeaseHeldError\n"
        f"l = Lease(Path({str(path)!r}), node_id='second')\n"
        "try:\n    l.acquire()\nexcept LeaseHeldError as e:\n    print(e); sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 3
    assert f"pid {os.getpid()}" in result.stdout and "node first" in result.stdout
    assert "http://127.0.0.1:5000" in result.stdout
    first.release()
    released = read_lease(path)  # expired in place: the file keeps its blocks for a full-disk restart
    assert released is not None and released.expires_at == 0.0


def test_dead_holder_is_taken_over(tmp_path):
    path = tmp_path / "skulk.lease"
    proc = subprocess.run(
        [sys.executable, "-c",
         f"from pathlib import Path; from skulk.datadir.lease import Lease; Lease(Path({str(path)!r}), node_id='dead').acquire()"],
        timeout=30,
    )
    assert proc.returncode == 0
    assert read_lease(path).node_id == "dead"  # left behind by a process that exited without releasing
    mine = Lease(path, node_id="alive")
    mine.acquire()
    assert read_lease(path).node_id == "alive"


def test_expired_lease_is_taken_over(tmp_path):
    path = tmp_path / "skulk.lease"
    clock = [1000.0]
    old = Lease(path, node_id="old", ttl_s=10, clock=lambda: clock[0])
    old.acquire()
    clock[0] += 11
    # Same pid (this process) but expired: a new holder may take it.
    new = Lease(path, node_id="new", ttl_s=10, clock=lambda: clock[0])
    new.acquire()
    assert read_lease(path).node_id == "new"


def test_renew_extends_expiry(tmp_path):
    path = tmp_path / "skulk.lease"
    clock = [1000.0]
    lease = Lease(path, node_id="me", ttl_s=10, clock=lambda: clock[0])
    lease.acquire()
    clock[0] += 5
    lease.renew()
    assert read_lease(path).expires_at == 1015.0


def test_renewal_failure_self_fences(tmp_path):
    path = tmp_path / "skulk.lease"
    lease = Lease(path, node_id="me", renew_interval_s=0.01)
    lease.acquire()
    # Someone else takes the data dir over (e.g. we were frozen past expiry).
    path.write_text(
        '{"pid": 1, "host": "other", "node_id": "thief", "api_endpoint": null, "acquired_at": 0, "expires_at": 9e12}'
    )
    fenced: list[str] = []

    async def main():
        await asyncio.wait_for(lease.run_renewal(fenced.append), timeout=5)

    asyncio.run(main())
    assert fenced and "thief" in fenced[0]
    assert not lease.held


def test_device_lease_is_at_a_fixed_location_independent_of_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SKULK_DEVICE_LEASE_DIR", str(tmp_path / "devices"))
    a = device_lease("cuda:0", node_id="a")
    b = device_lease("cuda:0", node_id="b")
    assert a.path == b.path == tmp_path / "devices" / "cuda-0.lease"
    a.acquire()
    with pytest.raises(LeaseHeldError):
        # Same process, but a live unexpired record from "another daemon" on this host:
        # simulate by pointing at a live pid that is not ours.
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            a.path.write_text(
                f'{{"pid": {proc.pid}, "host": "{HOST}", "node_id": "a", "api_endpoint": null, '
                f'"acquired_at": 0, "expires_at": {time.time() + 60}}}'
            )
            b.acquire()
        finally:
            proc.kill()
            proc.wait()
    assert device_lease("cuda:1", node_id="c").path != a.path


def test_a_lease_renews_and_is_retaken_on_a_full_disk(tmp_path):
    import errno as _errno

    from tests.fulldisk import fill, small_disk

    with small_disk(tmp_path / "disk") as disk:
        path = disk / "skulk.lease"
        lease = Lease(path, node_id="full")
        lease.acquire()
        fill(disk)
        with pytest.raises(OSError) as full:
            (disk / "one-more").write_bytes(b"x" * 8192)
        assert full.value.errno == _errno.ENOSPC  # the disk really is full
        lease.renew()  # in place: needs no free block
        lease.renew()
        lease.release()
        again = Lease(path, node_id="full-restarted")  # a restart on the same full disk
        record = again.acquire()
        assert read_lease(path) == record
