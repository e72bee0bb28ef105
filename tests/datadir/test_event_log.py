"""DiskEventLog: round trips, rotation, caps, snapshots, torn tails, and degradation.

Every test opens its log with `free_space_floor_bytes=0` unless it is about the floor, so
the suite does not depend on how full the test machine's disk is.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import zstandard

from skulk.datadir import event_log as event_log_module
from skulk.datadir.event_log import (
    COUNTING_ONLY,
    LIVE_FILE_NAME,
    PERSISTING,
    DiskEventLog,
    EventLogClosedError,
    EventLogReadError,
)

LOGGER = "skulk.datadir.event_log"
DEGRADED_LINE = "stopped persisting"


def rec(idx: int, pad: int = 40) -> dict:
    """A record shaped like an IndexedEvent's wire form."""
    return {
        "idx": idx,
        "origin": "node-a",
        "indexedAt": "2026-01-01T00:00:00Z",
        "event": {"type": "InstanceCreated", "instanceId": f"inst-{idx}", "pad": "x" * pad},
    }


def frame_len(record: dict) -> int:
    return 4 + len(msgpack.packb(record, use_bin_type=True))


def open_log(directory: Path, **kwargs) -> DiskEventLog:
    kwargs.setdefault("free_space_floor_bytes", 0)
    return DiskEventLog(directory, **kwargs)


def fill(log: DiskEventLog, first: int, last: int, pad: int = 40) -> list[dict]:
    records = [rec(i, pad) for i in range(first, last + 1)]
    for record in records:
        log.append(record)
    return records


def idxs(records) -> list[int]:
    return [r["idx"] for r in records]


def crash_image(log_dir: Path, dst: Path) -> Path:
    """The directory as a crash would leave it: files copied while the log is still open."""
    shutil.copytree(log_dir, dst)
    return dst


def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def degraded_lines(caplog) -> int:
    return sum(DEGRADED_LINE in r.getMessage() for r in caplog.records if r.name == LOGGER)


# ---- round trips ------------------------------------------------------------------------


def test_round_trip_in_live_file(tmp_path):
    with open_log(tmp_path) as log:
        records = fill(log, 1, 50)
        assert list(log.read_range(0)) == records
        assert idxs(log.read_range(10, 20)) == list(range(10, 20))
        assert idxs(log.read_range(45)) == list(range(45, 51))
        assert log.last_idx == 50
        assert log.stats()["archive_count"] == 0


def test_round_trip_across_rotation_and_reopen(tmp_path):
    log = open_log(tmp_path, rotate_bytes=2000)
    records = fill(log, 1, 300)
    stats = log.stats()
    assert stats["archive_count"] >= 3 and stats["live_bytes"] > 0
    assert list(log.read_range(0)) == records
    for start, end in [(1, 2), (40, 160), (150, 301), (299, None), (301, None)]:
        assert idxs(log.read_range(start, end)) == list(range(start, min(end or 301, 301)))
    log.close()
    assert not (tmp_path / LIVE_FILE_NAME).exists() or (tmp_path / LIVE_FILE_NAME).stat().st_size == 0

    reopened = open_log(tmp_path, rotate_bytes=2000)
    assert reopened.last_idx == 300
    assert list(reopened.read_range(0)) == records
    more = fill(reopened, 301, 320)
    assert list(reopened.read_range(290)) == records[289:] + more
    reopened.close()


def test_last_idx_recovered_after_a_crash(tmp_path):
    log = open_log(tmp_path / "log", rotate_bytes=2000)
    records = fill(log, 1, 120)
    image = crash_image(tmp_path / "log", tmp_path / "image")
    log.close()

    recovered = open_log(image, rotate_bytes=2000)
    assert recovered.last_idx == 120
    assert list(recovered.read_range(0)) == records
    with pytest.raises(ValueError):
        recovered.append(rec(120))
    recovered.append(rec(121))
    recovered.close()


def test_last_idx_survives_compacting_every_archive(tmp_path):
    log = open_log(tmp_path, rotate_bytes=2000)
    fill(log, 1, 100)
    log.close()
    log = open_log(tmp_path)
    assert log.compact_before(10_000) >= 1
    assert list(log.read_range(0)) == []
    log.close()
    with open_log(tmp_path) as reopened:
        assert reopened.last_idx == 100


@pytest.mark.parametrize(
    "bad",
    [{"idx": 5}, {"idx": 3}, {"idx": -1}, {"idx": "6"}, {"idx": True}, {"idx": 6.0}, {"origin": "x"}],
)
def test_append_rejects_bad_or_non_increasing_idx(tmp_path, bad):
    with open_log(tmp_path) as log:
        fill(log, 1, 5)
        with pytest.raises(ValueError):
            log.append(bad)
        assert log.last_idx == 5
        log.append(rec(6))


def test_append_after_close_raises(tmp_path):
    log = open_log(tmp_path)
    log.close()
    with pytest.raises(EventLogClosedError):
        log.append(rec(1))


# ---- caps ---------------------------------------------------------------------------


def test_archives_capped_by_count_oldest_first(tmp_path):
    with open_log(tmp_path, rotate_bytes=1500, max_archives=3) as log:
        records = fill(log, 1, 400)
        stats = log.stats()
        assert stats["archive_count"] == 3
        assert len(list(tmp_path.glob("events.*.bin.zst"))) == 3
        replay = list(log.read_range(0))
        assert replay == records[log.first_idx - 1 :]
        assert log.first_idx > 1


def test_archives_capped_by_total_bytes_oldest_first(tmp_path):
    cap = 1200
    with open_log(tmp_path, rotate_bytes=1500, max_archive_total_bytes=cap) as log:
        records = fill(log, 1, 400)
        stats = log.stats()
        on_disk = sum(p.stat().st_size for p in tmp_path.glob("events.*.bin.zst"))
        assert 1 <= stats["archive_count"] < 64
        assert stats["archive_bytes"] == on_disk <= cap
        assert list(log.read_range(0)) == records[log.first_idx - 1 :]


# ---- replay -------------------------------------------------------------------------


def test_replay_sees_a_fixed_view_while_appends_rotate_and_cap(tmp_path):
    with open_log(tmp_path, rotate_bytes=1500, max_archives=2) as log:
        fill(log, 1, 100)
        expected = list(log.read_range(0))
        replay = log.read_range(0)
        head = [next(replay) for _ in range(3)]
        # Enough appends to rotate many times: the archives being read are capped away
        # and the live file is replaced underneath the replay.
        fill(log, 101, 400)
        assert head + list(replay) == expected
        assert idxs(log.read_range(395)) == [395, 396, 397, 398, 399, 400]


def test_replay_from_another_thread_while_appending(tmp_path):
    with open_log(tmp_path, rotate_bytes=3000, max_archives=4) as log:
        fill(log, 1, 10)
        done = threading.Event()

        def writer():
            try:
                fill(log, 11, 1500)
            finally:
                done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        replays = 0
        while not done.is_set() or replays == 0:
            seen = idxs(log.read_range(0))
            assert seen == list(range(seen[0], seen[0] + len(seen)))
            replays += 1
        thread.join()
        seen = idxs(log.read_range(0))
        assert seen[-1] == 1500 and seen == list(range(seen[0], 1501))


def test_replay_opens_only_overlapping_archives(tmp_path):
    with open_log(tmp_path, rotate_bytes=2000) as log:
        fill(log, 1, 200)
        oldest = min(tmp_path.glob("events.*.bin.zst"), key=lambda p: int(p.name.split(".")[1].split("-")[0]))
        oldest.write_bytes(b"not zstd at all")
        oldest_last = int(oldest.name.split("-")[1].split(".")[0])
        assert idxs(log.read_range(oldest_last + 1)) == list(range(oldest_last + 1, 201))
        with pytest.raises(EventLogReadError):
            list(log.read_range(0))


def test_truncated_archive_is_reported_not_silently_short(tmp_path):
    with open_log(tmp_path, rotate_bytes=2000) as log:
        fill(log, 1, 200)
        archive = next(iter(tmp_path.glob("events.1-*.bin.zst")))
        data = archive.read_bytes()
        archive.write_bytes(data[: len(data) // 2])
        with pytest.raises(EventLogReadError):
            list(log.read_range(0))


# ---- snapshots and compaction ---------------------------------------------------------


def test_snapshot_and_compaction_keep_every_event_after_high_water(tmp_path):
    state = {"instances": {"inst-1": {"status": "running"}}, "counts": [1, 2, 3], 7: "int key"}
    log = open_log(tmp_path, rotate_bytes=2000)
    records = fill(log, 1, 300)
    assert log.write_snapshot(150, state)
    before = log.stats()["archive_count"]
    deleted = log.compact_before(151)
    assert deleted >= 1 and log.stats()["archive_count"] == before - deleted
    assert log.first_idx <= 151
    assert list(log.read_range(151)) == records[150:]
    assert log.latest_snapshot() == (150, state)
    log.close()

    reopened = open_log(tmp_path)
    assert reopened.latest_snapshot() == (150, state)
    assert list(reopened.read_range(151)) == records[150:]
    assert reopened.last_idx == 300
    reopened.close()


def test_compaction_never_deletes_at_or_after_idx(tmp_path):
    with open_log(tmp_path, rotate_bytes=2000) as log:
        records = fill(log, 1, 300)
        archives = sorted(tmp_path.glob("events.*.bin.zst"))
        first_of = {int(p.name.split(".")[1].split("-")[0]) for p in archives}
        middle = sorted(first_of)[2]
        log.compact_before(middle + 1)  # the archive starting at `middle` holds idx middle+1
        assert log.first_idx == middle
        assert list(log.read_range(0)) == records[middle - 1 :]


def test_snapshots_keep_latest_two_and_skip_a_corrupt_one(tmp_path, caplog):
    with open_log(tmp_path) as log:
        fill(log, 1, 30)
        for idx in (10, 20, 30):
            assert log.write_snapshot(idx, {"at": idx})
        assert sorted(p.name for p in tmp_path.glob("snapshot.*")) == [
            "snapshot.20.msgpack.zst",
            "snapshot.30.msgpack.zst",
        ]
        (tmp_path / "snapshot.30.msgpack.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage")
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert log.latest_snapshot() == (20, {"at": 20})
            assert log.latest_snapshot() == (20, {"at": 20})
        corrupt_lines = [r for r in caplog.records if "snapshot.30" in r.getMessage()]
        assert len(corrupt_lines) == 1
        with pytest.raises(ValueError):
            log.write_snapshot(31, {})


def test_no_snapshot_is_none(tmp_path):
    with open_log(tmp_path) as log:
        assert log.latest_snapshot() is None


# ---- torn tail ------------------------------------------------------------------------


def _torn_image(tmp_path: Path, count: int = 20) -> tuple[Path, list[dict]]:
    log = open_log(tmp_path / "log")
    records = fill(log, 1, count)
    image = crash_image(tmp_path / "log", tmp_path / "image")
    log.close()
    return image, records


@pytest.mark.parametrize(
    "cut_into_last",
    [1, 2, 3, 4, 5, "half", "all_but_one"],
    ids=lambda c: f"keep_{c}_bytes_of_last_frame",
)
def test_torn_tail_is_cut_and_appends_continue(tmp_path, cut_into_last, caplog):
    image, records = _torn_image(tmp_path)
    live = image / LIVE_FILE_NAME
    size = live.stat().st_size
    last_len = frame_len(records[-1])
    keep = {"half": last_len // 2, "all_but_one": last_len - 1}.get(cut_into_last, cut_into_last)
    os.truncate(live, size - last_len + keep)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        log = open_log(image)
    assert log.stats()["truncated_tail_bytes"] == keep
    assert any(f"cut {keep} bytes" in r.getMessage() for r in caplog.records)
    assert log.last_idx == 19
    assert list(log.read_range(0)) == records[:-1]
    log.append(rec(20))
    log.append(rec(21))
    assert idxs(log.read_range(0)) == list(range(1, 22))
    log.close()
    with open_log(image) as reopened:
        assert idxs(reopened.read_range(0)) == list(range(1, 22))


@pytest.mark.parametrize("payload", [b"\xc1\xc1\xc1", msgpack.packb({"no": "idx"}), msgpack.packb({"idx": 3})])
def test_trailing_record_that_does_not_decode_is_cut(tmp_path, payload):
    image, records = _torn_image(tmp_path)
    with open(image / LIVE_FILE_NAME, "ab") as fh:
        fh.write(len(payload).to_bytes(4, "big") + payload)
    with open_log(image) as log:
        assert log.stats()["truncated_tail_bytes"] == 4 + len(payload)
        assert list(log.read_range(0)) == records
        log.append(rec(21))


def test_interrupted_rotation_leaves_no_duplicates(tmp_path):
    image, records = _torn_image(tmp_path)
    # Crash after the archive was renamed into place, before the live file was replaced.
    live = image / LIVE_FILE_NAME
    (image / "events.1-20.bin.zst").write_bytes(zstandard.ZstdCompressor().compress(live.read_bytes()))
    (image / "events.21-25.bin.zst.tmp").write_bytes(b"half an archive")
    with open_log(image) as log:
        assert list(log.read_range(0)) == records
        assert log.last_idx == 20
        log.append(rec(21))
        assert idxs(log.read_range(0)) == list(range(1, 22))
    assert not list(image.glob("*.tmp"))


# ---- degradation: injected failures ------------------------------------------------------


def test_enospc_at_open_counts_only(tmp_path, monkeypatch, caplog):
    with open_log(tmp_path) as log:
        records = fill(log, 1, 10)
    monkeypatch.setattr(event_log_module, "_open_live", enospc)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        log = open_log(tmp_path)
        assert log.mode == COUNTING_ONLY
        assert log.last_idx == 10  # recovered from what is on disk
        fill(log, 11, 40)
    stats = log.stats()
    assert stats["last_idx"] == 40 and stats["records_counted_only"] == 30 and stats["records_written"] == 0
    assert stats["degraded_reason"].startswith("open:") and "No space" in stats["degraded_reason"]
    assert list(log.read_range(0)) == records
    assert degraded_lines(caplog) == 1
    log.close()


def test_unusable_directory_at_open_counts_only(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log = open_log(blocker / "log")
    assert log.mode == COUNTING_ONLY and log.last_idx is None
    fill(log, 1, 5)
    assert log.last_idx == 5
    assert list(log.read_range(0)) == []
    log.close()


def test_enospc_at_append_counts_only_and_keeps_what_was_written(tmp_path, monkeypatch, caplog):
    log = open_log(tmp_path)
    records = fill(log, 1, 5)
    real_write_all = event_log_module._write_all

    def short_write_then_enospc(fh, data):
        real_write_all(fh, data[: len(data) // 2])  # a partial frame reaches the file
        enospc()

    monkeypatch.setattr(event_log_module, "_write_all", short_write_then_enospc)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        fill(log, 6, 50)
    stats = log.stats()
    assert stats["mode"] == COUNTING_ONLY and stats["degraded_reason"].startswith("append:")
    assert stats["records_written"] == 5 and stats["records_counted_only"] == 45
    assert log.last_idx == 50
    assert degraded_lines(caplog) == 1
    assert list(log.read_range(0)) == records
    assert (tmp_path / LIVE_FILE_NAME).stat().st_size == sum(frame_len(r) for r in records)
    log.close()
    monkeypatch.undo()
    reopened = open_log(tmp_path)
    assert reopened.stats()["truncated_tail_bytes"] == 0
    assert reopened.last_idx == 50  # the high-water marker written on close
    reopened.append(rec(51))
    assert idxs(reopened.read_range(0)) == [1, 2, 3, 4, 5, 51]
    reopened.close()


def test_enospc_at_rotation_counts_only(tmp_path, monkeypatch):
    monkeypatch.setattr(event_log_module, "_compress_file", enospc)
    log = open_log(tmp_path, rotate_bytes=1000)
    records = fill(log, 1, 100)
    stats = log.stats()
    assert stats["mode"] == COUNTING_ONLY and stats["degraded_reason"].startswith("rotation:")
    assert log.last_idx == 100 and stats["archive_count"] == 0
    written = stats["records_written"]
    assert 0 < written < 100 and written + stats["records_counted_only"] == 100
    assert list(log.read_range(0)) == records[:written]
    assert not list(tmp_path.glob("*.tmp"))
    log.close()


def test_enospc_at_compaction_counts_only(tmp_path, monkeypatch):
    log = open_log(tmp_path, rotate_bytes=2000)
    records = fill(log, 1, 200)
    archives_before = log.stats()["archive_count"]
    monkeypatch.setattr(event_log_module, "_remove_file", enospc)
    assert log.compact_before(150) == 0
    stats = log.stats()
    assert stats["mode"] == COUNTING_ONLY and stats["degraded_reason"].startswith("compaction:")
    assert stats["archive_count"] == archives_before
    fill(log, 201, 210)
    assert log.last_idx == 210
    assert list(log.read_range(0)) == records
    log.close()


def test_other_compaction_error_is_recorded_and_log_keeps_persisting(tmp_path, monkeypatch, caplog):
    log = open_log(tmp_path, rotate_bytes=2000)
    fill(log, 1, 200)

    def eacces(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(event_log_module, "_remove_file", eacces)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert log.compact_before(150) == 0
        assert log.compact_before(150) == 0
    stats = log.stats()
    assert stats["mode"] == PERSISTING and stats["compaction_errors"] == 2
    assert "Permission denied" in stats["compaction_error"]
    assert sum("compaction failed" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.undo()
    fill(log, 201, 210)
    assert idxs(log.read_range(205)) == list(range(205, 211))
    log.close()


# ---- degradation: free-space floor ---------------------------------------------------------


def test_free_space_floor_at_open_counts_only(tmp_path):
    log = DiskEventLog(tmp_path, free_space_floor_bytes=1 << 30, disk_usage=lambda _p: SimpleNamespace(free=1 << 20))
    assert log.mode == COUNTING_ONLY and log.stats()["degraded_reason"].startswith("free-space floor")
    fill(log, 1, 10)
    assert log.last_idx == 10 and log.stats()["records_written"] == 0
    log.close()


def test_free_space_floor_checked_every_n_appends(tmp_path):
    disk = SimpleNamespace(free=10 << 30, calls=0)

    def disk_usage(path):
        disk.calls += 1
        assert path == str(tmp_path)
        return disk

    log = DiskEventLog(
        tmp_path, free_space_floor_bytes=2 << 30, free_space_check_every=10, disk_usage=disk_usage, clock=lambda: 123.0
    )
    fill(log, 1, 25)
    assert log.mode == PERSISTING and disk.calls == 1 + 2
    disk.free = 1 << 30
    fill(log, 26, 40)
    stats = log.stats()
    assert stats["mode"] == COUNTING_ONLY and stats["degraded_at"] == 123.0
    assert stats["records_written"] == 29  # the check before the 30th append caught it
    assert log.last_idx == 40
    assert idxs(log.read_range(0)) == list(range(1, 30))
    log.close()


def test_write_snapshot_in_counting_only_mode_writes_nothing(tmp_path):
    log = DiskEventLog(tmp_path, disk_usage=lambda _p: SimpleNamespace(free=0))
    fill(log, 1, 3)
    assert log.write_snapshot(3, {"a": 1}) is False
    assert log.latest_snapshot() is None
    log.close()


# ---- degradation: a real full disk ---------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if result.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip() or result.returncode}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=10).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=10)


def test_real_full_disk_degrades_to_counting_only(tiny_disk, caplog):
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        log = DiskEventLog(tiny_disk / "log", free_space_floor_bytes=0)
        records = []
        idx = 0
        while log.mode == PERSISTING and idx < 2000:
            idx += 1
            record = rec(idx, pad=900)
            log.append(record)
            records.append(record)
        fill(log, idx + 1, idx + 100, pad=900)
    stats = log.stats()
    assert stats["mode"] == COUNTING_ONLY and "No space left" in stats["degraded_reason"]
    assert log.last_idx == idx + 100
    written = stats["records_written"]
    assert written > 50 and stats["records_counted_only"] == 101
    assert list(log.read_range(0)) == records[:written]
    assert degraded_lines(caplog) == 1
    log.close()

    reopened = DiskEventLog(tiny_disk / "log", free_space_floor_bytes=0)
    assert reopened.stats()["truncated_tail_bytes"] == 0
    assert list(reopened.read_range(0)) == records[:written]
    assert reopened.last_idx >= written
    reopened.close()
