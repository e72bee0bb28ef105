"""Staging from the store on a real temporary filesystem: hardlinks on the store host (same
inode, no extra disk), a copy where linking fails, revision markers, eviction, purge."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from skulk.model_store.eviction import GIB, EvictionPolicy
from skulk.model_store.staging import (
    CanonicalPathRefused,
    Manifest,
    StagingFailed,
    StagingOptions,
    additional_bytes,
    apply_recency,
    is_safe_relative,
    manifest_from_marker,
    mark_used,
    remove_staged,
    remove_staged_dir,
    scan_staged,
    stage_from_local,
)
from skulk.models.downloads import MARKER_FILE_NAME, DownloadMarker, local_artifact, read_marker

MODEL = "acme/tiny"
REV_A = "a" * 40
REV_B = "b" * 40


def make_canonical(models_dir: Path, model_id: str = MODEL, revision: str = REV_A, *, pinned: bool = False,
                   files: dict[str, bytes] | None = None) -> Manifest:
    """A registered store copy: the files plus the download marker, as downloads.py writes it."""
    files = files if files is not None else {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": os.urandom(64 * 1024),
        "tokenizer.json": b"{}",
    }
    marker = DownloadMarker(model_id, revision, pinned, {p: len(b) for p, b in files.items()})
    manifest = manifest_from_marker(marker)
    model_dir = models_dir / manifest.dir_name
    for rel, data in files.items():
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_bytes(data)
    (model_dir / MARKER_FILE_NAME).write_text(json.dumps(marker.to_json()))
    return manifest


@pytest.fixture
def dirs(tmp_path):
    models, staging = tmp_path / "models", tmp_path / "staging"
    models.mkdir()
    return models, staging


def plenty(_path: Path) -> int:
    return 10**15


OPTIONS = StagingOptions(free_bytes=plenty)


def test_store_host_staging_hardlinks_every_file(dirs):
    models, staging = dirs
    manifest = make_canonical(models)
    before = shutil.disk_usage(models).used
    staged = stage_from_local(models / manifest.dir_name, manifest, staging, OPTIONS)
    for f in manifest.files:
        src, dst = (models / manifest.dir_name / f.path).stat(), (staged / f.path).stat()
        assert (dst.st_ino, dst.st_dev) == (src.st_ino, src.st_dev)
        assert src.st_nlink == 2
    # Zero extra disk for the weights (a few KiB of markers at most).
    assert shutil.disk_usage(models).used - before < 64 * 1024
    (entry,) = scan_staged(staging)
    assert (entry.model_id, entry.revision, entry.own_bytes) == (MODEL, REV_A, 0)
    assert entry.logical_bytes == manifest.total_bytes
    assert read_marker(staged).revision == REV_A


def test_staged_copy_resolves_like_a_download(dirs):
    # The staged marker is the download marker: downloads.local_artifact finds a staged
    # copy as it finds a downloaded one, and a pin to another commit does not match it.
    from tests.mockhub import hub_card

    models, staging = dirs
    manifest = make_canonical(models)
    staged = stage_from_local(models / manifest.dir_name, manifest, staging, OPTIONS)
    assert local_artifact(hub_card(MODEL), staging) == staged
    assert local_artifact(hub_card(MODEL, revision=REV_B), staging) is None


def test_falls_back_to_a_copy_where_the_filesystem_cannot_link(dirs, monkeypatch):
    models, staging = dirs
    manifest = make_canonical(models)

    def no_link(_src, _dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    staged = stage_from_local(models / manifest.dir_name, manifest, staging, OPTIONS)
    for f in manifest.files:
        src, dst = models / manifest.dir_name / f.path, staged / f.path
        assert dst.stat().st_ino != src.stat().st_ino and dst.stat().st_nlink == 1
        assert dst.read_bytes() == src.read_bytes()
    assert scan_staged(staging)[0].own_bytes == manifest.total_bytes


def test_other_link_errors_are_not_hidden(dirs, monkeypatch):
    models, staging = dirs
    manifest = make_canonical(models)

    def broken(_src, _dst):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "link", broken)
    with pytest.raises(OSError):
        stage_from_local(models / manifest.dir_name, manifest, staging, OPTIONS)
    assert not (staging / manifest.dir_name).exists()


def test_a_complete_copy_is_reused_and_marked_used(dirs):
    models, staging = dirs
    manifest = make_canonical(models)
    source = models / manifest.dir_name
    first = stage_from_local(source, manifest, staging, StagingOptions(free_bytes=plenty, now_s=100))
    ino = (first / "model.safetensors").stat().st_ino
    again = stage_from_local(source, manifest, staging, StagingOptions(free_bytes=plenty, now_s=200))
    assert again == first and (again / "model.safetensors").stat().st_ino == ino
    assert scan_staged(staging)[0].last_used_s == 200


def test_another_revision_is_replaced_only_after_the_new_one_is_complete(dirs, monkeypatch):
    models, staging = dirs
    old = make_canonical(models, revision=REV_A, files={"config.json": b"old", "w.safetensors": b"1" * 10})
    stage_from_local(models / old.dir_name, old, staging, OPTIONS)
    shutil.rmtree(models / old.dir_name)
    new = make_canonical(models, revision=REV_B, files={"config.json": b"new!", "w.safetensors": b"2" * 20})
    (models / new.dir_name / "w.safetensors").unlink()  # the store's copy is broken: staging must fail
    with pytest.raises(StagingFailed):
        stage_from_local(models / new.dir_name, new, staging, OPTIONS)
    assert read_marker(staging / old.dir_name).revision == REV_A  # the previous copy survives
    (models / new.dir_name / "w.safetensors").write_bytes(b"2" * 20)
    staged = stage_from_local(models / new.dir_name, new, staging, OPTIONS)
    assert read_marker(staged).revision == REV_B and (staged / "config.json").read_bytes() == b"new!"
    assert [e.revision for e in scan_staged(staging)] == [REV_B]


def test_pinned_revision_stages_into_its_own_directory(dirs):
    models, staging = dirs
    main = make_canonical(models, revision=REV_A)
    pinned = make_canonical(models, revision=REV_B, pinned=True)
    stage_from_local(models / main.dir_name, main, staging, OPTIONS)
    stage_from_local(models / pinned.dir_name, pinned, staging, OPTIONS)
    assert sorted(e.dir_name for e in scan_staged(staging)) == ["acme--tiny", f"acme--tiny@{REV_B}"]


def test_disk_safety_evicts_idle_copies_before_a_real_copy(dirs, monkeypatch):
    models, staging = dirs
    monkeypatch.setattr(os, "link", lambda *_: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    old = make_canonical(models, "acme/old", files={"w.safetensors": b"o" * 1000})
    stage_from_local(models / old.dir_name, old, staging, StagingOptions(free_bytes=plenty, now_s=1))
    new = make_canonical(models, "acme/new", files={"w.safetensors": b"n" * 1000})
    policy = EvictionPolicy(cleanup_on_deactivate=False, keep_recent_bytes=GIB, reserve_bytes=500)
    # 1200 free: 1000 new bytes + 500 reserve need 1500, so the idle 1000-byte copy goes.
    stage_from_local(models / new.dir_name, new, staging,
                     StagingOptions(policy=policy, free_bytes=lambda _p: 1200, now_s=2))
    assert [e.model_id for e in scan_staged(staging)] == ["acme/new"]


def test_disk_safety_refuses_before_transfer_and_keeps_live_copies(dirs, monkeypatch):
    models, staging = dirs
    monkeypatch.setattr(os, "link", lambda *_: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    live = make_canonical(models, "acme/live", files={"w.safetensors": b"l" * 1000})
    stage_from_local(models / live.dir_name, live, staging, OPTIONS)
    new = make_canonical(models, "acme/new", files={"w.safetensors": b"n" * 1000})
    policy = EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=GIB, reserve_bytes=500)
    with pytest.raises(StagingFailed) as failure:
        stage_from_local(models / new.dir_name, new, staging, StagingOptions(
            policy=policy, in_use_model_ids=frozenset({"acme/live"}), free_bytes=lambda _p: 1200))
    assert failure.value.kind == "disk" and "short by 300" in failure.value.reason
    assert [e.model_id for e in scan_staged(staging)] == ["acme/live"]
    assert not list(staging.glob(".acme--new.partial/w.safetensors"))


def test_recency_pass_keeps_newest_within_budget(dirs, monkeypatch):
    models, staging = dirs
    monkeypatch.setattr(os, "link", lambda *_: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    for i, name in enumerate(["acme/a", "acme/b", "acme/c"]):
        m = make_canonical(models, name, files={"w.safetensors": b"x" * 100})
        stage_from_local(models / m.dir_name, m, staging, StagingOptions(free_bytes=plenty, now_s=10 + i))
    policy = EvictionPolicy(cleanup_on_deactivate=True, keep_recent_bytes=150, reserve_bytes=0)
    result = apply_recency(staging, policy, frozenset({"acme/a"}), models, free_bytes=plenty)
    assert result.removed == ("acme--b",) and result.freed_bytes == 100
    assert sorted(e.model_id for e in scan_staged(staging)) == ["acme/a", "acme/c"]
    off = EvictionPolicy(cleanup_on_deactivate=False, keep_recent_bytes=0, reserve_bytes=0)
    assert apply_recency(staging, off, frozenset(), models, free_bytes=plenty).removed == ()


def test_remove_and_purge_skip_live_copies_and_never_touch_the_store(dirs):
    models, staging = dirs
    for name in ("acme/a", "acme/b"):
        m = make_canonical(models, name)
        stage_from_local(models / m.dir_name, m, staging, OPTIONS)
    one = remove_staged(staging, frozenset(), models, model_id="acme/a")
    assert one.removed == ("acme--a",)
    purge = remove_staged(staging, frozenset({"acme/b"}), models)
    assert (purge.removed, purge.kept_in_use) == ((), ("acme--b",))
    assert read_marker(models / "acme--a") is not None and read_marker(models / "acme--b") is not None
    assert (models / "acme--a" / "model.safetensors").stat().st_nlink == 1


def test_the_canonical_path_is_never_deleted(tmp_path):
    models = tmp_path / "models"
    make_canonical(models)
    with pytest.raises(CanonicalPathRefused):
        remove_staged_dir(models, "acme--tiny", models)
    with pytest.raises(ValueError):
        remove_staged_dir(tmp_path, "../models", None)
    assert read_marker(models / "acme--tiny") is not None


def test_mark_used_sets_the_clock(dirs):
    models, staging = dirs
    manifest = make_canonical(models)
    staged = stage_from_local(models / manifest.dir_name, manifest, staging, OPTIONS)
    mark_used(staged, 12345)
    assert scan_staged(staging)[0].last_used_s == 12345


@pytest.mark.parametrize(
    ("path", "safe"),
    [("config.json", True), ("sub/w.gguf", True), ("../x", False), ("/etc/passwd", False), ("a/../../x", False),
     ("a//b", False), ("./a", False), ("a\\b", False), ("", False), (MARKER_FILE_NAME, False)],
)
def test_is_safe_relative(path, safe):
    assert is_safe_relative(path) is safe


def test_manifest_refuses_unsafe_paths():
    raw = {"modelId": MODEL, "revision": REV_A, "pinned": False, "files": [{"path": "../evil", "sizeBytes": 1}]}
    with pytest.raises(StagingFailed) as failure:
        Manifest.from_json(raw)
    assert failure.value.kind == "invalid"


def test_additional_bytes_credits_resumable_data():
    manifest = Manifest(MODEL, REV_A, False, tuple())
    assert additional_bytes(manifest, {}, False) == 0
    m = manifest_from_marker(DownloadMarker(MODEL, REV_A, False, {"a": 100, "b": 50}))
    assert additional_bytes(m, {"a": 40}, False) == 110
    assert additional_bytes(m, {"a": 100, "b": 50}, False) == 0
    assert additional_bytes(m, {}, True) == 0


def test_purge_takes_idle_partials_but_never_an_active_transactions(dirs):
    from skulk.model_store.staging import admission_lock

    _models, staging = dirs
    partial = staging / ".acme--tiny.partial"
    partial.mkdir(parents=True)
    (partial / "w.part").write_bytes(b"resumable")
    with admission_lock(staging, MODEL):  # a staging is running
        remove_staged(staging, frozenset(), None)
    assert partial.exists()
    remove_staged(staging, frozenset(), None, model_id="acme/other")
    assert partial.exists()
    remove_staged(staging, frozenset(), None, model_id=MODEL)
    assert not partial.exists()
